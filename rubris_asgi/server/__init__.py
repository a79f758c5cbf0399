"""The ASGI endpoints: thin adapters between sockets and the sans-IO engine."""
