#!/usr/bin/env python
"""Django's command line for this project: python manage.py migrate, python manage.py runserver."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_service.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
