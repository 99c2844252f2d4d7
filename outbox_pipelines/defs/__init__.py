"""The Dagster layer: resources, ops, jobs, checks, schedules and sensors.

Thin by rule: each op, sensor or check calls one core function; no SQL and no
policy lives here. (No ``from __future__ import annotations``: Dagster reads
Config classes' annotations at runtime.)
"""

import warnings

import dagster as dg

# Dagster's own beta/supersession notices about its internals are noise for operators. Set here,
# the package's first lines, so they are off before any op, sensor or check is declared.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.SupersessionWarning)
