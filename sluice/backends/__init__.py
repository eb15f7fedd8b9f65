"""The backend seam: a ``Backend`` loads a model spec into a ``OneShotModel`` or a
``GenerativeModel``. Everything above this package works with any of them."""
