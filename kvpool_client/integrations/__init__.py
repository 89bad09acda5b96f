"""Engine integrations: each subpackage plugs kvpool into one engine through the engine's own
plugin interface, and imports that engine only when it is loaded by it.

What they share is beside them: :mod:`.settings` (the pool settings an engine's config
passes), :mod:`.namespaces` (the model and KV dtype fields of every namespace) and
:mod:`.regions` (a host cache's blocks where they lie, as the client's targets)."""
