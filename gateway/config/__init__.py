"""Configuration: the settings models (one per section, each named ``*Settings``; ``settings.Settings`` is the whole),
how they load (a TOML file, then ``KVGATE_*`` environment variables, then CLI flags), the reload that re-reads them
while kvgate runs and its guard, and the reference table rendered from the models."""
