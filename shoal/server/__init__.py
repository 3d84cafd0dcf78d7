"""Thin asyncio shells around the core state machines: scheduler and worker."""
