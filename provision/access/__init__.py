"""The renter's hands on a host: a login in the bootstrapped env (``shell``), ports reached from
this machine (``forward``), and plain OpenSSH trusting exactly our pinned key (``ssh-config``).

Beside ``jobs``: it uses the connection, the command quoting and the templates below it
(``remote``, ``config``); every channel it opens goes through ``channels.open_channel``.
"""
