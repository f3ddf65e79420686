# Everything a fresh machine with Python 3.11, pip and git needs: `make serve`, `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV))/bin
STAMP := $(VENV)/.installed-stamp
THIRD_PARTY := .build/third_party
RELEASED_IMAGE := proto/released/acp-1.2.binpb
export PATH := $(BIN):$(PATH)

.PHONY: setup serve test test-loops browser postgres programs newest-protobuf editor-clients node-packages fuzz chaos lint typecheck buf-deps buf-lint buf-breaking gen gen-check import-lint pytest bytecode bench bench-quick bench-tools bench-peer release-image clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

serve: $(STAMP)
	$(BIN)/agents serve --state-dir .acp $(SERVE_FLAGS)

test: $(STAMP) browser postgres programs newest-protobuf editor-clients node-packages
	$(MAKE) --no-print-directory lint typecheck buf-lint gen-check buf-breaking import-lint pytest

# Debian's Chromium for the console tests (Playwright drives it; `playwright install` is
# never used). Installed when missing and apt-get may run (as root); otherwise the browser
# tests skip, which the test run's header says loudly, and under CI=true they fail.
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "test: installing chromium for the browser tests"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null \
		|| echo "!!! test: could not install chromium: the browser tests will skip (fail under CI=true)"; \
	else echo "!!! test: $(CHROMIUM) is missing and apt-get cannot run here: the browser tests will skip (fail under CI=true)"; fi

# strace (the fsync durability test), curl (foreign clients) and openssl (TLS certificates):
# installed when missing and apt-get may run (as root); otherwise the tests needing them skip,
# which the test run's header says loudly, and under CI=true they fail (tests/needs.py).
PROGRAMS := strace curl openssl
programs:
	@missing=""; for p in $(PROGRAMS); do command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "test: installing$$missing for the tests that drive them"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; } >/dev/null \
		|| echo "!!! test: could not install$$missing: the tests needing them will skip (fail under CI=true)"; \
	else echo "!!! test:$$missing missing and apt-get cannot run here: the tests needing them will skip (fail under CI=true)"; fi

# The newest protobuf release pyproject.toml's pin allows, for
# tests/contract/test_codec_fast_newest_protobuf.py: installed here from the package index,
# never during a test. Without the index the one there is kept (or the test skips, loudly,
# and fails under CI=true).
NEWEST_PROTOBUF := .build/newest-protobuf
newest-protobuf: $(STAMP)
	@mkdir -p .build && rm -rf $(NEWEST_PROTOBUF).tmp; \
	pin=$$($(BIN)/python -c "import re, tomllib; print(next(d for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if re.match(r'protobuf\s*[<>=!~]', d)))"); \
	if $(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --only-binary :all: \
		--timeout 20 --retries 1 --target $(NEWEST_PROTOBUF).tmp "$$pin" >.build/newest-protobuf.log 2>&1; then \
		rm -rf $(NEWEST_PROTOBUF) && mv $(NEWEST_PROTOBUF).tmp $(NEWEST_PROTOBUF); \
	else rm -rf $(NEWEST_PROTOBUF).tmp; \
		echo "!!! test: could not install $$pin (.build/newest-protobuf.log): the newest-protobuf test uses what $(NEWEST_PROTOBUF) holds, or skips (fails under CI=true)"; fi

# Zed ACP clients nobody here wrote, for the `agents editor` tests: acpx from the npm registry
# (into .build/acpx) and the example client of the Zed ACP Python SDK's sdist (the pinned
# version's, into .build/zed-acp-sdk). Installed here, never during a test; without them the
# tests skip loudly (fail under CI=true).
ACPX_VERSION := 0.19.1
EDITOR_CLIENTS := .build/acpx/node_modules/.bin/acpx .build/zed-acp-sdk/examples/client.py
editor-clients: $(STAMP)
	@mkdir -p .build
	@if [ "$$(cat .build/acpx/.version 2>/dev/null)" = "$(ACPX_VERSION)" ]; then :; \
	elif command -v npm >/dev/null && npm install --silent --no-audit --no-fund --prefix .build/acpx acpx@$(ACPX_VERSION) >.build/acpx.log 2>&1; then \
		echo "$(ACPX_VERSION)" >.build/acpx/.version; \
	else echo "!!! test: could not install acpx $(ACPX_VERSION) (.build/acpx.log): the acpx tests will skip (fail under CI=true)"; fi
	@sdk=$$($(BIN)/python -c "from importlib import metadata; print(metadata.version('agent-client-protocol'))"); \
	if [ "$$(cat .build/zed-acp-sdk/.version 2>/dev/null)" = "$$sdk" ]; then :; \
	else rm -rf .build/zed-acp-sdk .build/zed-acp-sdk.tmp && mkdir -p .build/zed-acp-sdk.tmp && \
		if $(BIN)/python -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
			--timeout 20 --retries 1 -d .build/zed-acp-sdk.tmp "agent-client-protocol==$$sdk" >.build/zed-acp-sdk.log 2>&1 \
			&& tar -xzf .build/zed-acp-sdk.tmp/*.tar.gz -C .build/zed-acp-sdk.tmp; then \
			mkdir -p .build/zed-acp-sdk && mv .build/zed-acp-sdk.tmp/*/examples .build/zed-acp-sdk/ \
			&& echo "$$sdk" >.build/zed-acp-sdk/.version; \
		else echo "!!! test: could not fetch the Zed ACP SDK's sdist (.build/zed-acp-sdk.log): its example-client test will skip (fail under CI=true)"; fi; \
		rm -rf .build/zed-acp-sdk.tmp; fi

# The npm standardwebhooks package, for the test that runs docs/webhooks.md's Node example
# (tests/facade/webhooks/test_node_verify.py): into .build/standardwebhooks, never during a
# test; without it (or Node) that test skips loudly (fails under CI=true).
STANDARDWEBHOOKS_NODE_VERSION := 1.3.0
node-packages:
	@mkdir -p .build
	@if [ "$$(cat .build/standardwebhooks/.version 2>/dev/null)" = "$(STANDARDWEBHOOKS_NODE_VERSION)" ]; then :; \
	elif command -v npm >/dev/null && npm install --silent --no-audit --no-fund --prefix .build/standardwebhooks standardwebhooks@$(STANDARDWEBHOOKS_NODE_VERSION) >.build/standardwebhooks.log 2>&1; then \
		echo "$(STANDARDWEBHOOKS_NODE_VERSION)" >.build/standardwebhooks/.version; \
	else echo "!!! test: could not install standardwebhooks $(STANDARDWEBHOOKS_NODE_VERSION) from npm (.build/standardwebhooks.log): the Node webhook example test will skip (fail under CI=true)"; fi

# The local PostgreSQL for the PostgreSQL tests (tests/postgres.py): started when it is
# installed but stopped and we may (root); otherwise those tests skip, which the run says
# loudly, and under CI=true they fail. $ACP_TEST_POSTGRES points them elsewhere instead.
postgres:
	@if [ -n "$$ACP_TEST_POSTGRES" ]; then :; \
	elif command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then \
		echo "test: starting the local PostgreSQL for the PostgreSQL tests"; \
		pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -1) main start \
		|| echo "!!! test: could not start PostgreSQL: the PostgreSQL tests will skip (fail under CI=true)"; \
	else echo "!!! test: no PostgreSQL on 127.0.0.1:5432: the PostgreSQL tests will skip (fail under CI=true)"; fi

lint: $(STAMP)
	ruff check .
	ruff format --check .

typecheck: $(STAMP)
	@rm -rf .build/typecheck && mkdir -p .build/typecheck/cleveragents/acp
	@for d in contract facade gateway client; do ln -s ../../../../$$d .build/typecheck/cleveragents/acp/$$d; done
	@ln -s ../../../../gen/cleveragents/acp/v1 .build/typecheck/cleveragents/acp/v1
	mypy

# google/api and google/rpc come from the installed googleapis-common-protos wheel.
buf-deps: $(STAMP)
	@rm -rf $(THIRD_PARTY) && mkdir -p $(THIRD_PARTY)/google
	@src=$$($(BIN)/python -c "import google.api, pathlib; print(pathlib.Path(next(iter(google.api.__path__))).parent)"); \
	for d in api rpc; do mkdir -p $(THIRD_PARTY)/google/$$d && cp $$src/$$d/*.proto $(THIRD_PARTY)/google/$$d/; done

buf-lint: buf-deps
	buf lint

# A wire- or JSON-breaking change against the last released contract (1.2) fails here.
buf-breaking: buf-deps
	buf breaking proto --against $(RELEASED_IMAGE)

# Run deliberately, when a contract version is released.
release-image: buf-deps
	@mkdir -p $(dir $(RELEASED_IMAGE))
	buf build proto --exclude-source-info -o $(RELEASED_IMAGE)

gen: $(STAMP)
	rm -rf gen/cleveragents
	$(BIN)/python proto/generate.py gen

gen-check: $(STAMP)
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	{ $(BIN)/python proto/generate.py $$tmp >$$tmp/generate.log 2>&1 || { cat $$tmp/generate.log; exit 1; }; } && \
	if diff -r -q -x __pycache__ gen/cleveragents $$tmp/cleveragents; then echo "gen/ is up to date"; \
	else echo "gen/ differs from proto/: run 'make gen' and commit"; exit 1; fi

import-lint: $(STAMP)
	lint-imports

# The project's bytecode, written before a run: where PYTHONDONTWRITEBYTECODE is set (as in
# many CI images) no process writes it, and every process the tests start (a server, a CLI
# call: hundreds in a run) compiled each project module it imports again, about 0.3 s of CPU
# per server start. Up-to-date files are skipped; __pycache__ is ignored by git.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 contract facade gateway client gen bench tests

# pytest exits 5 when it collects nothing: that must fail, never pass as green.
pytest: $(STAMP) bytecode
	$(BIN)/python -m pytest --durations=25

# The whole suite the other way round from `make test`: in-process tests on uvloop, the
# servers tests start (agents serve subprocesses) on asyncio's loop. Together with `make
# test` every test has run on both loops (docs/testing.md).
test-loops: $(STAMP) bytecode browser postgres programs newest-protobuf editor-clients node-packages
	ACP_TEST_LOOP=uvloop ACP_LOOP=asyncio $(BIN)/python -m pytest

# The fuzz tests with many more examples than `make test` runs (ACP_FUZZ_EXAMPLES there: 4).
FUZZ_EXAMPLES ?= 200
fuzz: $(STAMP)
	ACP_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest tests/conformance/test_fuzz.py

# The fault-injection suite (tests/chaos/) at a larger scale than `make test` runs it (1):
# more writers and writes, the full 10 s PostgreSQL outage, every case. Needs root (tmpfs,
# its own PostgreSQL cluster as the postgres user); CI=true makes a missing piece fail.
CHAOS_SCALE ?= 4
chaos: $(STAMP) bytecode
	CI=true ACP_CHAOS_SCALE=$(CHAOS_SCALE) $(BIN)/python -m pytest tests/chaos --timeout 900

bench: $(STAMP) bench-tools bench-peer
	$(BIN)/python -m bench

bench-quick: $(STAMP) bench-tools bench-peer
	$(BIN)/python -m bench --quick

# The peer the `peer` family measures the product against (bench/peer.py): the A2A Python
# SDK, installed from the package index into a virtualenv of its own, so its pins never meet
# the project's. Made again when these pins change. Without the index the family says so
# loudly (and fails under CI=true); `make test` never needs it.
PEER_VENV := .build/peer
PEER_REQUIREMENTS := a2a-sdk[grpc,http-server]==1.3.0 uvicorn[standard]==0.55.0
bench-peer:
	@if [ "$$(cat $(PEER_VENV)/.requirements 2>/dev/null)" = "$(PEER_REQUIREMENTS)" ]; then :; \
	else echo "bench: installing the peer ($(PEER_REQUIREMENTS)) into $(PEER_VENV)"; \
		rm -rf $(PEER_VENV) && mkdir -p .build && $(PYTHON) -m venv $(PEER_VENV) \
		&& $(PEER_VENV)/bin/python -m pip install -q --disable-pip-version-check --timeout 20 --retries 1 \
			$(foreach r,$(PEER_REQUIREMENTS),'$(r)') >.build/bench-peer.log 2>&1 \
		&& echo "$(PEER_REQUIREMENTS)" >$(PEER_VENV)/.requirements \
		|| { rm -rf $(PEER_VENV); echo "!!! bench: could not install the peer (.build/bench-peer.log): the peer family will say so (and fail under CI=true)"; }; fi

# wrk and h2load (Debian's nghttp2-client) load the servers from outside Python. Installed
# here when missing and apt-get may run (as root); otherwise the benchmark falls back to
# Python load generators and labels its figures so. Never needed by `make test`.
bench-tools:
	@if command -v wrk >/dev/null && command -v h2load >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "bench: installing wrk and nghttp2-client"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nghttp2-client; } >/dev/null \
		|| echo "bench: could not install wrk/h2load; Python load generators will measure"; \
	else echo "bench: wrk/h2load missing (apt-get install wrk nghttp2-client); Python load generators will measure"; fi

clean:
	rm -rf $(VENV) .build .mypy_cache .ruff_cache
