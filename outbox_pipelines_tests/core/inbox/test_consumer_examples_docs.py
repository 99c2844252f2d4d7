"""docs/how-to/consumers.md shows the consumers of examples/consumers/ as they are: each ```python block marked
``<!-- from: PATH -->`` is found, as written, in that file, and each program the page's table names exists and
compiles. The programs themselves run against real brokers in drills/test_inbox_drill.py."""

import py_compile
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "how-to" / "consumers.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
MARKED = re.compile(r"^<!-- from: ([\w./-]+) -->\n```python\n(.*?)^```", re.M | re.S)
PROGRAMS = ("kafka_consumer.py", "rabbitmq_consumer.py", "nats_consumer.py", "webhook_receiver.py")


def test_every_block_on_the_page_is_in_its_example_as_written():
    text = PAGE.read_text()
    marked = MARKED.findall(text)
    assert len(marked) == len(BLOCK.findall(text)), "a python block without <!-- from: PATH -->"
    assert {Path(path).name for path, _ in marked} == set(PROGRAMS)
    for path, block in marked:
        assert block in (ROOT / path).read_text(), f"{PAGE.name}: a block is not in {path} as written"


def test_each_program_in_the_table_exists_and_compiles(tmp_path):
    text = PAGE.read_text()
    for name in PROGRAMS:
        assert f"`{name}`" in text
        py_compile.compile(str(ROOT / "examples" / "consumers" / name), cfile=str(tmp_path / f"{name}c"), doraise=True)
    assert sorted(p.name for p in (ROOT / "examples" / "consumers").glob("*.py")) == sorted(PROGRAMS)
