"""doctor: known failures of rented GPU hosts, matched in error texts and host facts.

``match`` is the entry point (``diagnose``); ``knowledge/`` holds the entries as data, one file
per phase (getting a GPU, installing, importing, building, training, data and models, host
state); ``libraries.yaml`` the packages that provide a missing shared object.
"""
