"""dmp's side of a Dask cluster: connecting to a scheduler, the quiet embedded cluster, and
registering the live monitor.

Below both the engine (whose Dask backend runs fits on the cluster) and `dmp.monitor` (whose
``dmp monitor ADDRESS`` follows them): neither imports the other for these.
"""

from __future__ import annotations

#: Dask settings for a cluster whose workers use every core (dmp's embedded cluster on a small
#: machine; `dask.config.set(QUIET_DASK_CONFIG)` around creating a LocalCluster): the event
#: loop's tick every 200 ms (default 20 ms), the system monitor every 5 s (0.5 s), no
#: statistical profiler.  With the defaults the driver process (client, scheduler, nannies)
#: takes a share of a core from the workers throughout a fit, which costs a small machine
#: part of its speed-up (BENCHMARKS.md, ParMAC: "With quieter Dask housekeeping").  Only the
#: Dask dashboard's system panels update less often and its profile page stays empty.
QUIET_DASK_CONFIG = {"distributed.admin.tick.interval": "200ms",
                     "distributed.admin.system-monitor.interval": "5s",
                     "distributed.worker.profile.enabled": False}


#: Dask's client TLS settings and the environment variables that set them
TLS_SETTINGS = {"tls_ca_file": ("distributed.comm.tls.ca-file",
                                "DASK_DISTRIBUTED__COMM__TLS__CA_FILE"),
                "tls_client_cert": ("distributed.comm.tls.client.cert",
                                    "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT"),
                "tls_client_key": ("distributed.comm.tls.client.key",
                                   "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY")}


def _client_security(address: str, security):
    """The ``Security`` a client of the TLS scheduler at ``address`` uses: ``security``, or
    Dask's configuration (``distributed.comm.tls.*``: a config YAML or
    ``DASK_DISTRIBUTED__COMM__TLS__*`` variables), checked to give a TLS context *before* a
    client exists (distributed otherwise fails inside its connect with a bare
    ``TypeError: TLS expects a `ssl_context` argument``)."""
    import os
    import ssl

    import dask
    from distributed.security import Security

    if security is None and dask.config.get("distributed.client.security-loader", None):
        return None      # the configured loader gives the client its credentials
    if isinstance(security, dict):
        security = Security(**security)
    elif security is None:
        security = Security()
    elif not isinstance(security, Security):
        raise TypeError(f"security must be a distributed.security.Security or a dict, "
                        f"got {type(security).__name__}")
    given = {field: getattr(security, field, None) for field in TLS_SETTINGS}
    for field, value in given.items():
        # a value with a newline is the PEM text itself (Security.temporary() gives those)
        if value and "\n" not in value and not os.path.isfile(value):
            raise ValueError(f"TLS {field[4:].replace('_', ' ')} {value!r} (Dask setting "
                             f"{TLS_SETTINGS[field][0]}) does not exist")
    try:
        context = security.get_connection_args("client")["ssl_context"]
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ValueError(f"the TLS certificate, key or CA of the client cannot be loaded "
                         f"({exc}); check {', '.join(n for n, _ in TLS_SETTINGS.values())}") \
            from None
    if context is None:
        missing = [TLS_SETTINGS[f] for f in ("tls_ca_file", "tls_client_cert") if not given[f]]
        raise ValueError(
            f"the scheduler at {address!r} uses TLS but no client certificate is set "
            f"(missing {' and '.join(n for n, _ in missing)}): give dmp's --tls-ca-file, "
            f"--tls-cert and --tls-key, or set Dask's "
            f"{', '.join(e for _, e in TLS_SETTINGS.values())} (or the same in a Dask "
            f"config YAML), or pass security=distributed.security.Security(...)")
    return security


def connect(address: str, *, timeout: str = "5s", set_as_default: bool = True,
            security=None):
    """A ``Client`` of the scheduler at ``address``.

    Parameters
    ----------
    address : str
        ``tcp://host:port``, or ``tls://host:port`` for a scheduler that uses TLS.
    timeout : str
        How long to try to reach the scheduler.
    set_as_default : bool
        Whether the client becomes Dask's default one.
    security : distributed.security.Security or dict, optional
        The client's TLS credentials (a ``dict`` gives ``Security``'s arguments, e.g.
        ``tls_ca_file``, ``tls_client_cert``, ``tls_client_key``).  By default Dask's
        configuration: ``distributed.comm.tls.ca-file``, ``distributed.comm.tls.client.cert``
        and ``distributed.comm.tls.client.key`` (a config YAML or the
        ``DASK_DISTRIBUTED__COMM__TLS__*`` environment variables).

    Raises
    ------
    ValueError
        ``address`` is not a scheduler address, or a ``tls://`` one without usable TLS
        credentials (checked before a client exists: a client that fails half-way blocks
        for seconds in its finaliser).
    ConnectionError
        The host name does not resolve, or nothing answers there within ``timeout``.
    """
    from distributed import Client
    from distributed.comm import parse_address
    from distributed.comm.addressing import parse_host_port

    try:
        protocol, location = parse_address(str(address))
        host = None
        if protocol in ("tcp", "tls", "ws", "wss"):
            host, port = parse_host_port(location)
    except ValueError as exc:
        raise ValueError(f"not a Dask scheduler address: {address!r} ({exc}); expected "
                         f"e.g. tcp://host:8786") from None
    if host:
        _check_resolves(host, port, address)
    if protocol in ("tls", "wss"):
        security = _client_security(address, security)
    try:
        return Client(address, timeout=timeout, set_as_default=set_as_default,
                      security=security)
    except (OSError, TimeoutError) as exc:
        # something answered and hung up: the usual sign of a TLS scheduler reached by TCP
        hint = (f" (if that scheduler uses TLS, its address is tls://{location})"
                if protocol == "tcp" and any(w in str(exc).lower() for w in ("reset", "closed"))
                else "")
        raise ConnectionError(f"cannot reach the Dask scheduler at {address!r}: {exc}{hint}") \
            from exc


def _check_resolves(host: str, port, address: str) -> None:
    """Raise a ConnectionError that says so when ``host`` is a name that does not resolve
    (Dask's client reports it only as a timeout, seconds later)."""
    import socket

    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConnectionError(f"cannot reach the Dask scheduler at {address!r}: the host "
                              f"name {host!r} does not resolve ({exc.strerror})") from None
    except (OSError, UnicodeError):   # anything else: let the client try and report it
        pass


def quiet_local_cluster(n_workers: int, **kwargs):
    """A ``LocalCluster`` of ``n_workers`` worker processes (single-threaded unless
    ``threads_per_worker`` says otherwise) created under ``QUIET_DASK_CONFIG``: the cluster
    ``dmp run`` embeds, and the one the benchmarks measure.  ``kwargs`` go to LocalCluster."""
    import dask
    from distributed import LocalCluster

    kwargs = {"threads_per_worker": 1, "processes": True, **kwargs}
    with dask.config.set(QUIET_DASK_CONFIG):
        return LocalCluster(n_workers=n_workers, **kwargs)


def _serves_bokeh(dask_scheduler) -> bool:
    return any("Bokeh" in type(app).__name__
               for app in dask_scheduler.http_application.applications)


def dashboard_base(client) -> str | None:
    """The base address of ``client``'s scheduler dashboard (``http://host:port``), or None
    when the scheduler serves none.

    A scheduler started with ``--no-dashboard`` still serves its HTTP routes (health, JSON,
    Prometheus) and lists them as its ``dashboard`` service, by default on port 8787, so
    ``client.dashboard_link`` names a page that does not exist: the scheduler is asked whether
    it serves the dashboard's pages.
    """
    try:
        link = client.dashboard_link
        serves = client.run_on_scheduler(_serves_bokeh)
    except (KeyError, AttributeError):
        return None
    if not link or not serves:
        return None
    return link.rsplit("/status", 1)[0]


# --------------------------------------------------------------------------- the monitor

#: registers dmp's monitor on a client's scheduler (see `register_monitor`); set by the
#: package (``dmp/__init__.py``) to `dmp.monitor.ensure_monitor`
_monitor_registrar = None


def set_monitor_registrar(registrar) -> None:
    """Make ``registrar(client) -> bool`` what `register_monitor` calls.

    The engine sits below the monitor (the monitor reads the engine's events) yet every fit on
    a cluster registers it: the engine asks through `register_monitor`, and the package, above
    both, says here who answers.
    """
    global _monitor_registrar
    _monitor_registrar = registrar


def register_monitor(client) -> bool:
    """Register dmp's monitor on ``client``'s scheduler (idempotent); False when it could not
    be (or nothing was set with `set_monitor_registrar`)."""
    if _monitor_registrar is None:
        return False
    return bool(_monitor_registrar(client))
