"""An order service on FastAPI and async SQLAlchemy (asyncpg) that writes each order and its outbox message in
one transaction: uvicorn fastapi_service.app:app"""
