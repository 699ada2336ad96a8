"""What vastctl uses though vulture cannot see it: one reason a group. .ci/run scans vastctl/ with this file and
the TypedDicts' fields (.ci/typed_fields.py); typer's commands and callbacks are left out by [tool.vulture]'s
ignore_decorators. A name here counts as used wherever it is defined, so keep each reason true for every place it
names."""
# ruff: noqa

# sqlite3 reads a connection's and a cursor's row_factory
_.row_factory
# prometheus_client calls a registered collector's collect() (serving/metrics.py)
_.collect
# logging.Formatter calls formatTime(record, datefmt); signal calls a handler with (signum, frame) (cli/serve.py)
_.formatTime
_.datefmt
_.signum
# waitress makes each request with its channel's parser_class (transport.py)
_.parser_class
# requests' .json() and .text read the body vast_http.py puts in _content
_._content
# a Protocol's __call__ spells subprocess.run's keywords for its callers (facts/provers.py Run)
_.__call__
_.capture_output
# imported for mypy only and named inside a string type: config.py's TypeVar bound (typeshed's
# DataclassInstance), agent/llm.py's cast("list[ToolParam]", ...) and cast("list[MessageParam]", ...)
DataclassInstance
ToolParam
MessageParam
# config fields read by name: settings.get takes the setting's key, reconcile reads timeouts.<state>
_.max_hourly_spend
_.max_daily_spend
_.bench_done
# the simulated market's boot faults are drawn by name (sim_market.boot_plan: getattr(rates, kind))
_.start_failed
_.stall
_.slow_bench
# RemoteInstance's fields are compared whole, a page repeated must agree (vast_mapping.instance_facts: astuple)
_.start_date
# bound.Bound's account of the program: bench/bounds.py prints it
_.hosts_priced
# a NamedTuple's field, read by unpacking (route/h2_connection.py Reset)
_.by_us
# the wire's vocabulary, named whole beside the names in use: gRPC's status codes and cuzk's service's
# methods and messages (route/wire.py; tests/test_route_wire.py reads them, protobuf builds the classes by name)
METHODS
STATUS_CANCELLED
STATUS_TIMEOUT
STATUS_UNKNOWN
_.type_name
SubmitProofRequest
AwaitProofResponse
ProveRequest
GetStatusRequest
QueueStatus
# every table's TypedDict by table name: tests/test_rows.py holds each to the migrated schema through it
TABLES
