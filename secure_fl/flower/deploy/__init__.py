"""``secure-fl deploy``: a Flower federation of separate processes (SuperLink + SuperNodes).

:mod:`.local` starts and stops one on loopback, :mod:`.certs` makes its CA, server
certificate and node keys, :mod:`.processes` finds and stops its processes by PID,
:mod:`.kill` times ``--kill``, :mod:`.timing` splits a round's wall time. See docs/deployment.md.
"""
