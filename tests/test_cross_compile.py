"""The op library is portable: it cross-compiles for aarch64 Linux with Debian's GNU toolchain and
the result loads under qemu-user (scripts/cross_compile_check.sh does the work)."""

import subprocess

from support import ROOT


def test_op_library_cross_compiles_for_aarch64(tmp_path):
    result = subprocess.run([str(ROOT / "scripts" / "cross_compile_check.sh"), "--qemu", str(tmp_path / "build")],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    library = tmp_path / "build" / "libdifflite_delegate.so"
    assert library.is_file()
    assert library.read_bytes()[18] == 0xB7, "ELF e_machine must be EM_AARCH64 (183)"
