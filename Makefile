# Thin wrappers around the project's commands (see README.md and docs/getting-started.md).
#   make install   venv + `pip install -e .[dev,analytics]` + Kafka jars + Prometheus + Chromium + Helm + HAProxy
#                  + Valgrind (idempotent)
#   make test      the whole test suite against real Kafka (the newest release the rig runs, rig/kafka.py)
#   make test-kafka-oldest  the same suite against the oldest release Sluice supports (TESTS=...: only those)
#   make test-kafka-oldest-behaviour  on the oldest release, the tests that depend on Kafka's behaviour
#   make test-repeat N=10 K=<pytest -k>  the broker-facing tests N times, each run its own session; prints how
#                  often each test failed (rig/repeat.py; TESTS=... narrows the paths)
#   make run       a real Kafka broker with Sluice in front of it, until Ctrl-C (BROKERS=3: a 3-broker cluster)
#   make bench     every bench (the modules of bench/), JSON lines on stdout
#   make bench-smoke  every bench's --smoke run (its whole path and its check, in seconds), judged; CI runs it
#   make lint      ruff + mypy + the documentation site (mkdocs build --strict)
#   make docs      the documentation site, docs/ into site/ (mkdocs.yml)
#   make test-image  the container image + docker-compose rig, built and run with Podman, checked from the host
#                  (root; installs podman & co. from Debian; rig/image.py)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The stamp lives inside the venv: deleting .venv re-runs install; editing the dependencies or the rig's pom too.
STAMP  := $(VENV)/.sluice-installed
# Run apt-get through sudo only when not already root.
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The Go consumer's source and where `make install` builds it (rig/group_consumer.py runs it from there)
GO_CONSUMER_SRC := rig/go/consumer/go.mod rig/go/consumer/go.sum rig/go/consumer/main.go
GO_CONSUMER := $(VENV)/bin/sluice-go-consumer
# Helm, pinned, from the Go module proxy (deploy/helm; rig/deploy.py runs it from the venv's bin), and the offline
# checker of the Kubernetes manifests (rig/go/kubecheck: the API's own Go types, strictly decoded)
HELM_VERSION := v3.22.0
KUBECHECK_SRC := rig/go/kubecheck/go.mod rig/go/kubecheck/go.sum rig/go/kubecheck/main.go
LINT_DIRS := $(shell for d in proxy rig bench; do ls $$d/*.py >/dev/null 2>&1 && echo $$d; done)

.PHONY: docs docs-only install install-python install-kafka install-debian install-go test test-kafka-oldest test-kafka-oldest-behaviour test-repeat run bench bench-smoke lint lint-only \
	test-image

install: $(STAMP)

# Four independent parts, run side by side (`make -j4`): on a machine that has none of it, the downloads (PyPI,
# Maven Central, Debian) and the Go builds (Helm's alone is ~100 s of two cores) overlap instead of adding up.
# - python: the venv (Python 3.11's bundled pip does editable pyproject installs; checked in a fresh venv); the
#   package with its dev and analytics extras (pyspark + matplotlib: the report tests run the real job); then
#   Spark's Kafka connector and Delta Lake resolved into Ivy's cache, once: `make test`'s two Spark sessions start
#   side by side and must not both download them (rig/spark_packages.py)
# - kafka: the Kafka jars of every release the rig runs (KAFKA_HOME, else the cache, else Maven Central); prints
#   where. rig/kafka.py needs only the standard library, so the system's Python runs it while the venv is built.
# - debian, each only if missing, in one apt-get run: Prometheus + promtool (a test scrapes the proxy with a real
#   Prometheus), Chromium (the analytics report is checked in a real headless browser), HAProxy (bench.passthrough's
#   C relay; /usr/sbin, which a user's PATH may not hold) and Valgrind (bench.instructions counts with callgrind)
# - go, into the venv's bin: the Go consumer (franz-go, kafka-go, sarama: rig/go/consumer/) the sharing tests run;
#   Helm $(HELM_VERSION) (go install from the Go module proxy, only when the venv's is not that version); and
#   sluice-kubecheck
$(STAMP): pyproject.toml rig/pom.xml $(GO_CONSUMER_SRC) $(KUBECHECK_SRC)
	$(MAKE) --no-print-directory -j4 install-python install-kafka install-debian install-go
	touch $@

install-python:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev,analytics]'
	$(PY) -m rig.spark_packages

install-kafka:
	$(PYTHON) -m rig.kafka fetch --all

install-debian:
	missing=""; \
	{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || missing="$$missing prometheus"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	{ command -v haproxy || test -x /usr/sbin/haproxy; } >/dev/null 2>&1 || missing="$$missing haproxy"; \
	command -v valgrind >/dev/null 2>&1 || missing="$$missing valgrind"; \
	if [ -n "$$missing" ]; then \
	    $(SUDO) apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

install-go:
	mkdir -p $(VENV)/bin
	cd rig/go/consumer && go build -o $(CURDIR)/$(GO_CONSUMER) .
	if ! go version -m $(VENV)/bin/helm 2>/dev/null | grep -q "^[[:space:]]*mod[[:space:]]*helm.sh/helm/v3[[:space:]]*$(HELM_VERSION)[[:space:]]"; then \
	    GOBIN=$(CURDIR)/$(VENV)/bin go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); \
	fi
	cd rig/go/kubecheck && go build -o $(CURDIR)/$(VENV)/bin/sluice-kubecheck .

# Lint first: main stays ruff- and mypy-clean (cheap next to the suite).
# Four pytest sessions at once. The broker-facing tests mostly wait on Kafka's clocks (heartbeats, sessions,
# retries, a JVM client's start) and leave much of the two cores idle, so the client tests (tests/clients, the
# slowest half) run in a session of their own beside the rest. Spark's tests (tests/analytics, CPU-bound: local[2])
# run at a low CPU priority (nice 10): they take mostly the cycles the others leave idle and hardly delay a test
# that waits on a clock, yet come before what CI runs at the lowest (nice 19: the benches' smoke runs, the image),
# which left them starved for 25 minutes. They are the last to end, alone, and one Spark session's many tiny jobs
# keep ~1.3 of the two cores busy: so they run as two sessions of about equal length (ANALYTICS_FIRST, and the
# rest of the directory), which together keep both cores busy once the others are done. Each session has its own
# brokers, on free ports; the others' output follows the rest's, whole.
# Each session picks its ports from a range of its own (rig/kafka.py PORT_RANGE_ENV), below the kernel's ephemeral
# range (32768 up): sessions side by side never pick the same port (.ci/run runs bench-smoke beside them too), nor
# one that docker-compose.yml publishes (19092, 19094, 9644, 9090: .ci/run runs make test-image beside them).
PORTS_TEST      ?= 10000-14499
PORTS_CLIENTS   ?= 14500-18999
PORTS_ANALYTICS ?= 20000-21999
PORTS_ANALYTICS_2 ?= 22000-23999
PORTS_OLDEST    ?= 24000-29999
PORTS_BENCH     ?= 30000-32767
PORTS_IMAGE     ?= 19100-19999
# The first of the two Spark sessions (timed in one session, on a busy machine: these ~430 s, the rest ~420 s);
# a new module of tests/analytics goes to the second.
ANALYTICS_FIRST := tests/analytics/test_landed.py tests/analytics/test_generated.py \
	tests/analytics/test_real_proxy.py tests/analytics/test_report_browser.py
test: install lint-only
	@logs=$$(mktemp -d); trap 'rm -rf "$$logs"' EXIT; \
	SLUICE_PORT_RANGE=$(PORTS_ANALYTICS) nice -n 10 $(PY) -m pytest -q $(ANALYTICS_FIRST) >"$$logs/analytics" 2>&1 & \
	spark=$$!; \
	SLUICE_PORT_RANGE=$(PORTS_ANALYTICS_2) nice -n 10 $(PY) -m pytest -q tests/analytics \
	    $(addprefix --ignore=,$(ANALYTICS_FIRST)) >"$$logs/analytics2" 2>&1 & spark2=$$!; \
	SLUICE_PORT_RANGE=$(PORTS_CLIENTS) $(PY) -m pytest -q tests/clients >"$$logs/clients" 2>&1 & clients=$$!; \
	status=0; SLUICE_PORT_RANGE=$(PORTS_TEST) $(PY) -m pytest -q tests/ examples/ --ignore=tests/analytics \
	    --ignore=tests/clients || status=$$?; \
	clients_status=0; wait $$clients || clients_status=$$?; \
	echo "# tests/clients, beside the rest (exit $$clients_status)"; cat "$$logs/clients"; \
	spark_status=0; wait $$spark || spark_status=$$?; \
	echo "# $(ANALYTICS_FIRST), beside the rest (exit $$spark_status)"; cat "$$logs/analytics"; \
	spark2_status=0; wait $$spark2 || spark2_status=$$?; \
	echo "# the rest of tests/analytics, beside the rest (exit $$spark2_status)"; cat "$$logs/analytics2"; \
	[ $$status -eq 0 ] && [ $$clients_status -eq 0 ] && [ $$spark_status -eq 0 ] && [ $$spark2_status -eq 0 ]

# The broker tests on the oldest supported Kafka (KAFKA_OLDEST in rig/kafka.py); the version is one setting.
TESTS ?= tests/
test-kafka-oldest: install
	SLUICE_PORT_RANGE=$(PORTS_OLDEST) \
	SLUICE_KAFKA_VERSION=$$($(PY) -c 'from rig.kafka import KAFKA_OLDEST; print(KAFKA_OLDEST)') $(PY) -m pytest -q \
	    $(if $(K),-k "$(K)") $(TESTS)

# The tests whose outcome depends most on how Kafka behaves, for the oldest supported Kafka (.ci/run):
# the cluster (failover, fencing, replica moves throttled through sidecars: the followers' own Fetch versions, share
# groups, the fleet's transactions and compaction), the group coordinator (cooperative consumption) and Fetch
# sessions (Sluice's own and the clients'); the Java client of that release (Kafka's own) takes part in the sharing
# and session tests.
# Left to the newest release alone, to keep CI within 30 minutes: SASL, the authorizer (the fleet on a locked-down
# broker: StandardAuthorizer's rules are the same across 4.x), the throttles and quotas of client fetches (Sluice
# leaving partitions out and delaying answers: the Fetch versions they read are the sessions tests' too), the
# clients' relay tests (the Python clients' and the Java client's produce and consume of every codec,
# tests/clients/test_java.py), the
# sharing tests of batches filtered empty, the Java consumer's 60 s of served fetch sessions and the fleet's control
# cluster outage (their outcome is Sluice's relaying, filtering and session serving, librdkafka's reconnects and the
# clients' readers, the same whichever release answers; the broker's side of sessions stays, in the broker-restart
# test; the fleet's transactions and compacted topic stay, in the other fleet tests). So are the leader killed -9
# under every kind of client (how each client follows a leader move through Sluice's rewritten Metadata: Kafka's
# errors on such a move stay, as each release sends them, in the failover file's other test) and the fleet's
# throttle set applied by every sidecar (the move throttled through the leader's sidecar stays, in
# test_replication_throttle), and the consumers reading from a follower in their rack (KIP-392: the selector and
# PreferredReadReplica are unchanged across 4.x; what the test checks is Sluice's relaying of them): together
# ~185 CPU-s of a CPU-bound CI run. Sharing on 4.1.2 runs once per
# group protocol and per protocol generation of its clients, not once per client: six consumers with the Java
# client (classic and KIP-848) and with franz-go (the newest versions first: OffsetCommit v9 on 4.1, v10 on 4.2+),
# one member killed (confluent), the mixed classic/KIP-848 group; the other clients and the kill/restart tests
# (every Sluice killed and restarted, classic and KIP-848) exercise Sluice's side, the same on either release.
KAFKA_BEHAVIOUR_TESTS := tests/cluster tests/clients/test_sharing.py tests/clients/test_sessions_clients.py \
	tests/integration/test_sessions_terminate.py
KAFKA_BEHAVIOUR_K := not test_quota_cluster and not test_one_record_batches_of_every_codec_reach_every_client_once and \
	not test_java_consumer_sessions_served_for_60s and \
	not test_control_cluster_down_serving_goes_on_and_changes_arrive_when_it_is_back and \
	not confluent-classic and not kafka-python-classic and not aiokafka-classic and not kafka-go-classic and \
	not confluent-consumer and not one_killed_mid_way[kafka-python] and not one_killed_mid_way[aiokafka] and \
	not test_kip848_consumer_and_its_sluice_killed_mid_way_nothing_lost and \
	not test_kip848_member_without_sluice_keeps_whole_partitions and not test_kip848_every_sluice_killed_and_restarted \
	and not test_every_sluice_killed_and_restarted_positions_come_back_from_kafka and \
	not test_leader_kill9_and_restart_every_client_follows and \
	not test_one_throttle_set_is_applied_by_every_sidecar_and_throttles_the_move and \
	not test_consumers_naming_their_rack_read_from_its_follower_through_sluice
test-kafka-oldest-behaviour:
	$(MAKE) test-kafka-oldest TESTS="$(KAFKA_BEHAVIOUR_TESTS)" K="$(KAFKA_BEHAVIOUR_K)"

# The broker-facing tests (marker "broker") N times; K: a pytest -k expression; TESTS: paths.
N ?= 10
test-repeat: install
	$(PY) -m rig.repeat --runs $(N) -m broker $(if $(K),-k "$(K)") $(TESTS)

run: install
	$(PY) -m rig.run $(if $(BROKERS),--brokers $(BROKERS))

# The benches are the modules of bench/ (bench/support/ holds what they share): bench/__main__.py runs them.
bench: install
	$(PY) -m bench

# Every bench's --smoke (its whole path and its check, in seconds), two at a time (most of a smoke run waits on a
# broker, a JVM's start or a client's pace), each pair on ports of its own; CI runs it. ONLY / SKIP: comma-separated
# bench names to run / to leave out.
bench-smoke: install
	SLUICE_PORT_RANGE=$(PORTS_BENCH) $(PY) -m bench --smoke --jobs 2 $(if $(ONLY),--only $(ONLY)) $(if $(SKIP),--skip $(SKIP))

lint: install lint-only

# Podman, podman-compose and the base images (local stand-ins when no registry answers) are rig/image.py's job;
# they are kept in ~/.cache/sluice/podman between runs.
test-image: install
	SLUICE_PORT_RANGE=$(PORTS_IMAGE) $(PY) -m rig.image

lint-only: docs-only
	$(VENV)/bin/ruff check $(LINT_DIRS) tests config/grafana examples
	$(VENV)/bin/mypy $(LINT_DIRS) tests config/grafana/dashboard.py examples/sluice-schema-id/src

# The documentation site (mkdocs.yml: docs/ into site/). --strict: a broken link, a missing page or anchor, any
# warning fails it; lint runs it, so CI does.
docs: install docs-only

docs-only:
	$(VENV)/bin/mkdocs build --strict --quiet
