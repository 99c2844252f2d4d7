"""The WSGI application: gunicorn django_service.wsgi"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_service.settings")

application = get_wsgi_application()
