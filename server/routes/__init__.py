"""The HTTP endpoints of PROTOCOL.md, one router per concern; ``server.app`` mounts them."""
