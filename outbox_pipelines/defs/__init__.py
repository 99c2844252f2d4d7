"""The Dagster layer: resources, ops, jobs, checks, schedules and sensors.

Thin by rule: each op, sensor or check calls one core function; no SQL and no
policy lives here. (No ``from __future__ import annotations``: Dagster reads
Config classes' annotations at runtime.)
"""
