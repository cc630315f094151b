"""Typed configuration, one concern a module: `yaml_io` (strict YAML in, plain YAML out), `sources` (which file
wrote each key), `typed` (YAML onto dataclasses, a library dataclass's keyword arguments), `checks` (the fields'
validators), `overlays` (`base:` chains, dotted overrides, `load_config`), `explain` (each field's type, default,
source and help; which stages read each section), `redaction` (secrets), `names` (plain names)."""
