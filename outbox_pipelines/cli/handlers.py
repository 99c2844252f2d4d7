"""Each command's function, named by its module and imported when the command runs: a ``relay`` process loads
none of the other commands' modules (nor the core modules they need), so it reaches its first claim sooner."""

import argparse
from importlib import import_module


class Command:
    """The function ``cli/<module>.py`` defines under ``function``, called like it (the parser's ``handler``)."""

    def __init__(self, module: str, function: str) -> None:
        self.module = f"outbox_pipelines.cli.{module}"
        self.function = function

    def __call__(self, args: argparse.Namespace) -> int:
        return int(getattr(import_module(self.module), self.function)(args) or 0)

    def __repr__(self) -> str:
        return f"{self.module}.{self.function}"


cmd_db_create_table = Command("db_commands", "cmd_db_create_table")
cmd_db_grant = Command("db_commands", "cmd_db_grant")
cmd_db_hand_over = Command("db_commands", "cmd_db_hand_over")
cmd_db_status = Command("db_commands", "cmd_db_status")
cmd_db_stop = Command("db_commands", "cmd_db_stop")
cmd_db_upgrade = Command("db_commands", "cmd_db_upgrade")
cmd_db_url = Command("db_commands", "cmd_db_url")
cmd_enqueue = Command("enqueue_command", "cmd_enqueue")
cmd_init = Command("init_command", "cmd_init")
cmd_metrics = Command("metrics_command", "cmd_metrics")
cmd_status = Command("oncall_commands", "cmd_status")
cmd_clean = Command("operations_commands", "cmd_clean")
cmd_replay = Command("operations_commands", "cmd_replay")
cmd_requeue_stuck = Command("operations_commands", "cmd_requeue_stuck")
cmd_skip = Command("operations_commands", "cmd_skip")
cmd_relay = Command("relay_commands", "cmd_relay")
cmd_broker_sim = Command("servers", "cmd_broker_sim")
cmd_demo = Command("servers", "cmd_demo")
cmd_dev = Command("servers", "cmd_dev")
cmd_oncall_page = Command("servers", "cmd_oncall_page")
cmd_order_api = Command("servers", "cmd_order_api")
