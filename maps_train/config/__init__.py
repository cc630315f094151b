"""Typed configuration, one concern a module: `yaml_io` (strict YAML in, plain YAML out), `sources` (which file
wrote each key), `typed` (YAML onto dataclasses, field checks, a library dataclass's keyword arguments),
`overlays` (`base:` chains, dotted overrides, `load_config`), `redaction` (secrets), `names` (plain names)."""
