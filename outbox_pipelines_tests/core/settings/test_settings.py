"""Settings: the seeds' environment variables and the one file a user edits."""

import re

import pytest

from outbox_pipelines.core.errors import ConfigError, UnknownTable
from outbox_pipelines.core.retry import RetryPolicy, all_presets
from outbox_pipelines.core.settings import load_settings, parse_duration
from outbox_pipelines.core.settings.sections import check_section

PRESETS = all_presets()

# The demo's parts: the tests below read the order product's and the examples' tables beside their own.
DEMO_PARTS = 'parts = ["orders", "examples"]\n'


def test_defaults_without_file_or_environment():
    settings = load_settings(env={}, path=None)
    orders = settings.table("outbox_orders")
    assert (orders.destination, orders.url) == ("orders", None)  # no OUTBOX_BROKER_URL: the paper order broker
    assert orders.retry == PRESETS["orders"]
    assert settings.table("outbox_memory").dedup is True
    events = settings.table("outbox_events")
    assert (events.destination, events.mode) == ("handlers", "single-active")
    env = settings.env
    assert (env.batch_size, env.handler_threads, env.idle_sleep_s, env.stuck_threshold_s) == (100, 4, 0.2, 600.0)
    assert (env.lock_ttl_s, env.cleaner_retention_s, env.relay_enabled, env.cleaner_enabled) == (
        60.0,
        604800.0,
        True,
        True,
    )


def test_seed_environment_variables():
    settings = load_settings(
        env={
            "OUTBOX_BROKER_URL": "http://127.0.0.1:9/orders",
            "OUTBOX_BATCH_SIZE": "32",
            "OUTBOX_PARALLELISM": "2",
            "OUTBOX_RETRY_MAX": "5",
            "OUTBOX_IDLE_SLEEP_MS": "50",
            "OUTBOX_STUCK_THRESHOLD_MIN": "3",
            "OUTBOX_RELAY_LOCK_TTL": "90s",
            "OUTBOX_RELAY_MAX_ATTEMPTS": "12",
            "OUTBOX_CLEANER_RETENTION": "24h",
            "OUTBOX_RELAY_ENABLED": "false",
        },
        path=None,
    )
    orders = settings.table("outbox_orders")
    assert (orders.destination, orders.url) == ("orders", "http://127.0.0.1:9/orders")
    assert (orders.batch_size, orders.handler_threads, orders.retry.max_attempts) == (32, 2, 5)
    assert (orders.idle_sleep_s, orders.stuck_threshold_s, orders.lease_s) == (0.05, 180.0, 90.0)
    assert settings.table("outbox_events").retry.max_attempts == 12
    assert settings.table("outbox_events").retention_s == 86400.0
    assert orders.relay_enabled is False


def test_config_file_overrides_and_adds_tables(tmp_path):
    path = tmp_path / "outbox.toml"
    path.write_text(
        DEMO_PARTS + '[tables.outbox_orders]\nurl = "http://127.0.0.1:9/x"\nmax_attempts = 3\nbase = "500ms"\n\n'
        '[tables.hrm_outbox]\ndestination = "handlers"\nhandlers = "outbox_pipelines.examples.handlers:registry"\n'
        'on_success = "delete"\nmode = "single-active"\npaused_topics = ["noisy"]\n'
    )
    settings = load_settings(env={}, path=path)
    orders = settings.table("outbox_orders")
    assert (orders.destination, orders.retry.max_attempts, orders.retry.base_s) == ("orders", 3, 0.5)
    hrm = settings.table("hrm_outbox")
    assert (hrm.on_success, hrm.mode, hrm.paused_topics) == ("delete", "single-active", ("noisy",))


@pytest.mark.parametrize(
    "text, message",
    [
        ("[tables.x]\ndestination = 'paper'\nmode = 'both'\n", "mode must be one of competing, single-active"),
        (
            "[tables.x]\ndestinaton = 'http'\n",
            "unknown keys \\['destinaton'\\] \\('destinaton': did you mean 'destination'\\?\\)",
        ),
        (
            "[tables.x]\ndestination = 'paper'\nmax_attemps = 3\nzzz = 1\n",
            "\\('max_attemps': did you mean 'max_attempts'\\?\\);",
        ),
        ("[tables.X]\n", "invalid outbox table name"),
        ("[tables.x]\ndestination = 'paper'\npreset = 'fast'\n", "unknown retry preset 'fast'"),
        ("[tables.x]\ndestination = 'handlers'\n", "needs handlers"),
        ("[tables.x]\ndestination = 'paper'\ntimeout = 'soon'\n", "cannot read duration 'soon'"),
        # issue 22: no implicit destination
        ("[tables.x]\nmode = 'competing'\n", "names no destination: set destination"),
        ("[tables.x]\ndestination = 'http'\n", r'\[tables.x\] destination = "http" has no url'),
        ("[tables.x]\ndestination = 'http'\nurl = ''\n", "url must be an http"),
        (
            "[tables.x]\ndestination = 'http'\nurl = 'http://h'\nalready_processed = 'yes'\n",
            "already_processed must be a list",
        ),
        ("[tables.x]\ndestination = 'http'\nurl = 'http://h'\nalready_processed = ['=x']\n", "is not field=value"),
        (
            "[tables.x]\ndestination = 'http'\nurl = 'http://h'\ntoken_env = 'NO_SUCH_TOKEN_VAR'\n",
            "NO_SUCH_TOKEN_VAR is not set",
        ),
        ("[tables.x]\ndestination = 'http'\nurl = 'http://h'\ntoken_env = 'not a name'\n", "must name an environment"),
        ("[tables.x]\ndestination = 'paper'\ntoken_env = 'OUTBOX_BROKER_TOKEN'\n", "token_env applies to a table"),
        ("[tables.x\n", "not valid TOML"),
        (
            "[tables.x]\ndestination = 'http'\nurl = 'http://h'\npreset = 'memory'\nmax_attempts = 60\n",
            "idempotency window",
        ),
    ],
)
def test_config_errors_say_what_to_fix(tmp_path, text, message):
    """A section's mistake is that table's: the file still loads, the table is left out and named with the
    error, and everything that asks for it (or the strict check) gets the message."""
    path = tmp_path / "outbox.toml"
    path.write_text(DEMO_PARTS + text)
    try:
        settings = load_settings(env={}, path=path)
    except ConfigError as exc:  # the file as a whole cannot be read (not TOML)
        assert re.search(message, str(exc)), exc
        return
    [(name, error)] = settings.broken.items()
    assert re.search(message, error), error
    assert name not in settings.tables and "outbox_events" in settings.tables  # the others load
    with pytest.raises(ConfigError, match=message):
        settings.table(name)
    with pytest.raises(ConfigError, match=message):
        settings.check()


def test_unknown_table_names_the_file_to_edit():
    with pytest.raises(UnknownTable, match=r"\[tables.nope\]"):
        load_settings(env={}, path=None).table("nope")


def test_config_found_through_environment(tmp_path):
    path = tmp_path / "custom.toml"
    path.write_text(DEMO_PARTS + "[tables.outbox_events]\nbatch_size = 7\n")
    assert load_settings(env={"OUTBOX_CONFIG": str(path)}).table("outbox_events").batch_size == 7
    with pytest.raises(ConfigError, match="does not name a file"):
        load_settings(env={"OUTBOX_CONFIG": str(tmp_path / "missing.toml")})


@pytest.mark.parametrize(
    "text, seconds", [("500ms", 0.5), ("60s", 60), ("10m", 600), ("168h", 604800), ("7d", 604800), ("2.5", 2.5)]
)
def test_durations(text, seconds):
    assert parse_duration(text, "x") == seconds


def test_backoff_presets_follow_the_seeds():
    no_jitter = lambda lo, hi: 0.0  # noqa: E731
    orders = PRESETS["orders"]
    assert [orders.delay_s(n, no_jitter) for n in range(1, 9)] == [2, 4, 8, 16, 32, 64, 128, 256]
    memory = PRESETS["memory"]
    assert [memory.delay_s(n, no_jitter) for n in (1, 2, 6, 7, 20)] == [60, 120, 1920, 3600, 3600]
    generic = PRESETS["generic"]
    assert [generic.delay_s(n, no_jitter) for n in (1, 6, 7, 25)] == [1, 32, 60, 60]
    assert (orders.jitter, memory.jitter) == (0.1, 0.3)


def test_jitter_bounds_with_an_injected_random_source():
    policy = RetryPolicy(base_s=60, max_s=3600, max_attempts=5, jitter=0.3)
    assert policy.delay_s(2, lambda lo, hi: lo) == pytest.approx(84.0)
    assert policy.delay_s(2, lambda lo, hi: hi) == pytest.approx(156.0)


def test_retry_horizon_of_every_preset_is_inside_the_ledger_window():
    for policy in PRESETS.values():
        policy.check_inside_window()
    assert PRESETS["orders"].horizon_s() < 600  # the orders preset gives up after minutes


# -- issue 22: where messages go is never implicit ---------------------------------------------------------


def test_the_paper_broker_is_said_plainly_when_chosen_or_when_the_broker_url_is_unset(tmp_path):
    path = tmp_path / "outbox.toml"
    path.write_text(DEMO_PARTS + '[tables.audit_log]\ndestination = "paper"\n')
    settings = load_settings(env={}, path=path)
    assert "marked sent and delivered nowhere" in settings.table("audit_log").delivers_nowhere
    orders = settings.table("outbox_orders")
    assert "OUTBOX_BROKER_URL is unset" in orders.delivers_nowhere and "delivers nothing" in orders.delivers_nowhere
    assert settings.table("outbox_events").delivers_nowhere is None
    with_broker = load_settings(env={"OUTBOX_BROKER_URL": "http://127.0.0.1:9/orders"}, path=path)
    assert with_broker.table("outbox_orders").delivers_nowhere is None


def test_the_broker_token_goes_only_to_the_brokers_origin_unless_a_table_names_it(tmp_path):
    path = tmp_path / "outbox.toml"
    path.write_text(
        DEMO_PARTS + '[tables.same_origin]\ndestination = "http"\nurl = "http://broker.internal:8700/hooks"\n\n'
        '[tables.third_party]\ndestination = "http"\nurl = "https://hooks.example.com/in"\n\n'
        '[tables.chosen]\ndestination = "http"\nurl = "https://hooks.example.com/in"\n'
        'token_env = "OUTBOX_BROKER_TOKEN"\n\n'
        '[tables.own_token]\ndestination = "http"\nurl = "https://billing.example.com/in"\n'
        'token_env = "BILLING_TOKEN"\n'
    )
    env = {
        "OUTBOX_BROKER_URL": "http://broker.internal:8700/orders",
        "OUTBOX_BROKER_TOKEN": "brk-token-1",
        "BILLING_TOKEN": "billing-token-2",
    }
    settings = load_settings(env=env, path=path)
    assert settings.table("outbox_orders").token == "brk-token-1"
    assert settings.table("same_origin").token == "brk-token-1"
    assert settings.table("third_party").token is None
    assert settings.table("chosen").token == "brk-token-1"
    assert settings.table("own_token").token == "billing-token-2"
    # never in a repr (Dagster and logs print settings objects)
    assert "brk-token-1" not in repr(settings) and "billing-token-2" not in repr(settings)


def test_a_tables_already_processed_rules_reach_its_destination(tmp_path):
    from outbox_pipelines.core.destinations.http.outcomes import classify_response

    path = tmp_path / "outbox.toml"
    path.write_text(
        '[tables.hooks]\ndestination = "http"\nurl = "http://127.0.0.1:9/h"\nalready_processed = ["result=DUPLICATE"]\n'
    )
    hooks = load_settings(env={}, path=path).table("hooks")
    said = b'{"result": "duplicate"}'
    assert classify_response(409, {}, said, already_processed=hooks.already_processed).kind == "sent"
    assert classify_response(409, {}, said).kind == "dead"  # not one of the strict defaults
    from outbox_pipelines.core.destinations.wiring import build_destination

    destination = build_destination(hooks, load_settings(env={}, path=path))
    try:
        assert destination.already_processed is hooks.already_processed
    finally:
        destination.close()


def test_a_handlers_module_whose_own_import_fails_names_what_to_install(tmp_path, monkeypatch):
    """The module is there, but a library it imports is not installed: the fix is installing that library, not
    moving the module ("put it in your project's package" is for a module that cannot be found)."""
    package = tmp_path / "team_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "handlers.py").write_text(
        "import not_installed_dependency\nfrom outbox_pipelines import HandlerRegistry\nregistry = HandlerRegistry()\n"
    )
    (package / "typo.py").write_text("from outbox_pipelines import HandlerRegistri\n")  # installed, no such name
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "outbox.toml"
    path.write_text(
        "shipped_tables = false\n"
        "[tables.dep_outbox]\ndestination = 'handlers'\nhandlers = 'team_pkg.handlers:registry'\n"
        "[tables.gone_outbox]\ndestination = 'handlers'\nhandlers = 'team_pkg.gone:registry'\n"
        "[tables.typo_outbox]\ndestination = 'handlers'\nhandlers = 'team_pkg.typo:registry'\n"
    )
    broken = load_settings(env={}, path=path).broken
    assert "importing team_pkg.handlers needs not_installed_dependency, which is not installed" in broken["dep_outbox"]
    assert "install it in every process that runs the outbox" in broken["dep_outbox"]
    assert "pip install -e ." not in broken["dep_outbox"]
    assert "cannot import team_pkg.gone" in broken["gone_outbox"] and "pip install -e ." in broken["gone_outbox"]
    typo = broken["typo_outbox"]
    assert "importing team_pkg.typo raised ImportError: cannot import name 'HandlerRegistri'" in typo, typo
    assert "install" not in typo


def test_a_key_that_is_not_text_is_that_tables_mistake_not_a_crash():
    """A defs.yaml section can hold keys YAML reads as numbers or booleans (1:, yes:): the table is refused with
    the others named, as for any unknown key."""
    with pytest.raises(ConfigError, match=r"unknown keys \[1, False, 'max_attemps'\] \('max_attemps': did you mean"):
        check_section("t_outbox", {1: "x", False: "y", "max_attemps": 3, "destination": "paper"}, None)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('max_attempts = "five"', r"max_attempts must be a whole number, like 25; got 'five' \(str\)"),
        ('batch_size = "ten"', r"batch_size must be a whole number"),
        ("timeout = true", r"timeout must be a duration, like \"5s\""),
        ('jitter = "0.1"', r"jitter must be a number, like 0.1"),
        ('dedup = "yes"', r"dedup must be true or false"),
        ('paused_topics = "a"', r"paused_topics must be a list of text"),
        ("mode = 3", r"mode must be text, in quotes; got 3 \(int\)"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_key_and_what_it_takes(tmp_path, line, message):
    path = tmp_path / "outbox.toml"
    path.write_text(f'[tables.shop_outbox]\ndestination = "paper"\n{line}\n')
    settings = load_settings(env={}, path=path)
    assert re.search(r"\[tables\.shop_outbox\] " + message, settings.broken["shop_outbox"])
    key = line.split(" =")[0]
    value = {"true": True, "3": 3}.get(line.split("= ")[1], line.split("= ")[1].strip('"'))
    with pytest.raises(ConfigError, match=message):  # the component's YAML goes through the same check
        check_section("shop_outbox", {"destination": "paper", key: value}, None)


def test_the_cli_says_which_key_is_wrong_without_a_traceback(tmp_path, cli_env):
    from outbox_pipelines_tests.conftest import run_cli

    (tmp_path / "outbox.toml").write_text('[tables.shop_outbox]\ndestination = "paper"\nmax_attempts = "five"\n')
    done = run_cli(cli_env, "enqueue", "--table", "shop_outbox", "--topic", "t", "--payload", "{}", cwd=tmp_path)
    assert done.returncode == 2
    assert "max_attempts must be a whole number, like 25; got 'five'" in done.stderr
    assert "Traceback" not in done.stderr
