"""Engine integrations: each subpackage plugs kvpool into one engine through the engine's own
plugin interface, and imports that engine only when it is loaded by it."""
