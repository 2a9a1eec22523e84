"""Configuration: the settings models (one per section, each named ``*Settings``; ``settings.Settings`` is the whole),
how they load (a TOML file, then ``KVGATE_*`` environment variables, then CLI flags), the reload that re-reads them
while kvgate runs and its guard, and the reference table rendered from the models.

Low in the layers (tests/test_layers.py): above ``support`` and ``memory`` (a backend's settings are checked
with memory's cache types and sizes), below everything that reads settings. The reload holds the live tenant
directory, which admission builds: ``LiveSettings`` is handed its constructor (``create_app`` passes
``TenantDirectory``) rather than import a layer above."""
