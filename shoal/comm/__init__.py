"""Transports: framed connections over TCP, and the handshake."""
