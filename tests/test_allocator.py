"""The allocator attnkit's processes start on (attnkit.allocator): jemalloc where the system has it, the command line
started again under it before torch is imported, its input and arguments unchanged; never a loop, never over an
allocator the user preloads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attnkit import allocator
from attnkit.allocator import JEMALLOC_CONF, AllocatorError, relaunch_environment
from test_cli import LineReader, attnkit_cmd, end

# the environment of a process started by hand, not by the Makefile (which preloads jemalloc itself)
PLAIN = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF", "ATTNKIT_ALLOCATOR",
                                                          "ATTNKIT_ALLOCATOR_RELAUNCHED")}
needs_jemalloc = pytest.mark.skipif(allocator.find_jemalloc() is None,
                                    reason="no jemalloc on this system (Debian: libjemalloc2, which make installs)")


def test_the_environment_started_again_preloads_jemalloc_with_attnkits_settings_once():
    env = relaunch_environment({"PATH": "/bin"}, "libjemalloc.so.2", under_jemalloc=False)
    assert env == {"PATH": "/bin", "LD_PRELOAD": "libjemalloc.so.2", "MALLOC_CONF": JEMALLOC_CONF,
                   "ATTNKIT_ALLOCATOR_RELAUNCHED": "1"}
    # once started again it goes on, even where the library could not be preloaded: no loop
    assert relaunch_environment(env, "libjemalloc.so.2", under_jemalloc=False) is None
    # a library the user preloads stays, before jemalloc is added; their MALLOC_CONF is theirs
    env = relaunch_environment({"LD_PRELOAD": "libfoo.so", "MALLOC_CONF": "narenas:1"}, "libjemalloc.so.2", False)
    assert env["LD_PRELOAD"] == "libjemalloc.so.2 libfoo.so" and env["MALLOC_CONF"] == "narenas:1"


@pytest.mark.parametrize("environ, library, under", [
    ({}, "libjemalloc.so.2", True),  # already on jemalloc (the Makefile preloads it)
    ({}, None, False),  # no jemalloc on this system: the C library's malloc, as before
    ({"ATTNKIT_ALLOCATOR": "system"}, "libjemalloc.so.2", False),  # asked for the C library's
    ({"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"}, "libjemalloc.so.2", False),  # an allocator of the user's own
])
def test_the_process_goes_on_as_it_is_where_jemalloc_runs_it_or_cannot_or_should_not(environ, library, under):
    assert relaunch_environment(environ, library, under) is None


def test_a_command_line_runs_on_jemalloc_where_preloaded_or_started_again_under_it():
    assert allocator.command_line_allocator({}, "libjemalloc.so.2") == "jemalloc"
    assert allocator.command_line_allocator({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, None) == "jemalloc"
    assert allocator.command_line_allocator({"ATTNKIT_ALLOCATOR": "system"}, "libjemalloc.so.2") == "system"
    assert allocator.command_line_allocator({"LD_PRELOAD": "libtcmalloc.so.4"}, "libjemalloc.so.2") == "system"
    assert allocator.command_line_allocator({}, None) == "system"  # no jemalloc on the system


def test_an_unknown_allocator_is_refused_by_name():
    with pytest.raises(AllocatorError, match="ATTNKIT_ALLOCATOR='tcmalloc': expected one of jemalloc, system"):
        relaunch_environment({"ATTNKIT_ALLOCATOR": "tcmalloc"}, "libjemalloc.so.2", False)
    out = subprocess.run(attnkit_cmd("--version"), capture_output=True, text=True, timeout=120,
                         env={**PLAIN, "ATTNKIT_ALLOCATOR": "tcmalloc"})
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr == "attnkit: error: ATTNKIT_ALLOCATOR='tcmalloc': expected one of jemalloc, system\n"


def test_loaded_libraries_are_read_from_a_maps_file():
    maps = ("7f0000000000-7f0000001000 r--p 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
            "7f0000001000-7f0000002000 rw-p 00000000 00:00 0 \n"
            "7f0000002000-7f0000003000 r-xp 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
            "7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0 [stack]\n")
    assert allocator.loaded_libraries(maps) == {"libjemalloc.so.2", "libc.so.6"}


SCRIPT = ("from attnkit.allocator import relaunch_under_jemalloc, current\n"
          "relaunch_under_jemalloc()\n"
          "import sys\n"
          "print(current(), sys.argv[1:], sys.stdin.read().strip())\n")


@needs_jemalloc
def test_a_process_starts_again_under_jemalloc_with_its_arguments_and_input():
    out = subprocess.run([sys.executable, "-c", SCRIPT, "a b", "c"], input="from stdin\n", capture_output=True,
                         text=True, env=PLAIN, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "jemalloc ['a b', 'c'] from stdin\n"
    out = subprocess.run([sys.executable, "-c", SCRIPT], input="", capture_output=True, text=True, timeout=60,
                         env={**PLAIN, "ATTNKIT_ALLOCATOR": "system"})
    assert out.stdout == "system [] \n", out.stderr


@needs_jemalloc
def test_the_command_line_translates_under_jemalloc_with_its_own_pid(trained_checkpoint):
    """``attnkit translate`` started by hand runs on jemalloc: the process started again replaces the first one
    (the same pid, which a supervisor or a test watches), and reads the input written to the first."""
    proc = subprocess.Popen(attnkit_cmd("translate", "--checkpoint", trained_checkpoint, "--beam", "1", "--threads",
                                        "1"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**PLAIN, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    try:
        proc.stdin.write(b"1 May 2000\n")
        proc.stdin.flush()
        LineReader(proc.stdout).readline(timeout=300)  # a translation came back: the process is working
        with open(f"/proc/{proc.pid}/maps") as f:
            assert any(name.startswith("libjemalloc") for name in allocator.loaded_libraries(f.read()))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    finally:
        end(proc)
