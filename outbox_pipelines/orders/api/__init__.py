"""The Order API (seed 001): POST /do/order with an idempotency ledger, on Starlette."""
