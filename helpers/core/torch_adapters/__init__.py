"""Small adapters, one per family of torch's private APIs the kit relies on; nothing else in helpers/ touches them.

Each module says which torch version it was written for and exactly what it relies on,
and has a ``check()`` that raises ``TorchAPIChanged`` naming the torch API that moved
(``tests/test_torch_adapters.py`` runs every check, so an upgrade of torch fails there,
loudly, instead of deep inside a lecture). Public face of ``helpers.core.torch_adapters``.
"""
from helpers.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".changes": ["ADAPTERS", "TorchAPIChanged", "check_all"],
})
