# make setup: venv + package with its test extra + system packages the sandbox needs.
# make test: setup, the lint, the docs site (strict), then the suite.
# make docs: the docs site into build/site (strict).
# make demo: a CPU-only sandbox host and a mirror of its own, the main job against it, then it
#            stops what it started.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# test processes side by side (pytest-xdist), one test file each at a time: the sandbox tests
# mostly wait on their hosts, so more than the 2 cores of a CI machine pay; 0 runs in one process
TEST_WORKERS ?= 3
# Debian/Ubuntu packages the sandbox hosts use: sshd, the distro's Python with venv (stand-ins,
# test installer), curl (downloads on the hosts), ss (listen check), unshare/nsenter, and
# chromium (headless: the compare page's chart must render in a real browser), rsync (sync's
# faster transport, on both ends of the sandbox link), sudo (the hosts' logins that are not root).
SYSTEM_PACKAGES := openssh-server python3-venv curl iproute2 util-linux chromium rsync sudo

.PHONY: test lint demo docs setup system-deps clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,dev]'
	touch $@

system-deps:
	@missing=""; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	command -v ss >/dev/null || missing="$$missing iproute2"; \
	command -v nsenter >/dev/null || missing="$$missing util-linux"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v rsync >/dev/null || missing="$$missing rsync"; \
	command -v sudo >/dev/null || missing="$$missing sudo"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$missing"; apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  elif [ "$$CI" = true ]; then echo "CI needs:$$missing (install them as root)"; exit 1; \
	  else echo "sandbox tests will skip: missing$$missing (install them as root)"; fi; \
	fi

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check provision tests bench templates/gpu
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy templates/gpu/*.py

# the venv with the package (editable, its test and dev extras) and the system packages
setup: $(VENV)/.installed system-deps

# the documentation site, strict: a broken link or anchor, or a page left out of mkdocs.yml's
# nav, fails (the command reference is generated from the tasks' own help)
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

test: $(VENV)/.installed system-deps lint docs
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

demo: $(VENV)/.installed system-deps
	$(PY) -m tests.sandbox demo

clean:
	-$(PY) -m tests.sandbox stop --all
	rm -rf $(VENV) logs reports
