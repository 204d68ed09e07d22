"""Mime (full): MimeLite's base optimizer with a control variate; see
`tff_cluster.algorithms.mime_lite`, where both are defined."""

from tff_cluster.algorithms.mime_lite import make_mime_definition as make_definition  # noqa: F401
from tff_cluster.algorithms.mime_lite import make_mime_driver as make_driver  # noqa: F401
