"""A stand-in for Android's `adb`, for tests of `difflite bench --adb` where no phone is attached.

Put a shim named `adb` that runs this file first on PATH. It implements:
  adb devices                      the devices of $FAKE_ADB_DEVICES ("SERIAL:STATE,...")
  adb -s SERIAL push SRC DST       copies SRC into the fake device's file system
  adb -s SERIAL shell CMD...       runs CMD with the local sh, device paths mapped
The fake device's file system is the folder $FAKE_ADB_ROOT: a device path /data/... or
/sdcard/... is $FAKE_ADB_ROOT/data/... (in push destinations and anywhere in shell commands).
The device has a `getprop` (ro.product.model "Fake Pixel", ro.product.cpu.abi arm64-v8a,
ro.board.platform "fakesoc"). Errors mimic adb's: an unknown serial ("adb: device 'X' not found",
exit 1), a device that is not ready, $FAKE_ADB_FAIL_PUSH set (every push fails: device full).
Every invocation is appended to $FAKE_ADB_LOG (one JSON list per line) when that is set."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

DEVICE_PATH = re.compile(r"(?<![\w./-])/(data|sdcard)(?=/|\b)")
GETPROP = """#!/bin/sh
case "$1" in
  ro.product.model) echo "Fake Pixel" ;;
  ro.product.cpu.abi) echo arm64-v8a ;;
  ro.board.platform) echo fakesoc ;;
  *) echo ;;
esac
"""


def devices() -> dict[str, str]:
    listed = {}
    for item in os.environ.get("FAKE_ADB_DEVICES", "emulator-5554:device").split(","):
        if item.strip():
            serial, _, state = item.strip().partition(":")
            listed[serial] = state or "device"
    return listed


def root() -> Path:
    folder = os.environ.get("FAKE_ADB_ROOT")
    if not folder:
        sys.exit("fake adb: FAKE_ADB_ROOT is not set")
    return Path(folder)


def to_local(text: str) -> str:
    return DEVICE_PATH.sub(lambda m: f"{root()}/{m.group(1)}", text)


def to_device(text: str) -> str:
    return re.sub(rf"{re.escape(str(root()))}/(data|sdcard)(?=/|\b)", r"/\1", text)


def push(source: str, destination: str) -> int:
    src = Path(source)
    if not src.exists():
        print(f"adb: error: cannot stat '{source}': No such file or directory", file=sys.stderr)
        return 1
    if os.environ.get("FAKE_ADB_FAIL_PUSH"):
        print(f"adb: error: failed to copy '{source}' to '{destination}': remote No space left on device",
              file=sys.stderr)
        return 1
    if not destination.startswith("/"):
        print(f"adb: error: remote path '{destination}' must be absolute", file=sys.stderr)
        return 1
    target = Path(to_local(destination))
    if destination.endswith("/") or target.is_dir():
        target = target / src.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, target)
    size = src.stat().st_size
    print(f"{source}: 1 file pushed, 0 skipped. 123.4 MB/s ({size} bytes in 0.001s)")
    return 0


def shell(command: str) -> int:
    bin_dir = root() / "system" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    getprop = bin_dir / "getprop"
    if not getprop.exists():
        getprop.write_text(GETPROP)
        getprop.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    process = subprocess.run(["sh", "-c", to_local(command)], cwd=root(), env=env, capture_output=True, text=True)
    # What the device prints names device paths, not the fake's folder.
    sys.stdout.write(to_device(process.stdout))
    sys.stderr.write(to_device(process.stderr))
    return process.returncode


def main(argv: list[str]) -> int:
    log = os.environ.get("FAKE_ADB_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(argv) + "\n")
    serial = None
    if argv[:1] == ["-s"]:
        if len(argv) < 2:
            print("adb: -s requires an argument", file=sys.stderr)
            return 1
        serial, argv = argv[1], argv[2:]
    if not argv:
        print("adb: no command", file=sys.stderr)
        return 1
    command, args = argv[0], argv[1:]
    listed = devices()
    if command == "devices":
        print("List of devices attached")
        for s, state in listed.items():
            print(f"{s}\t{state}")
        print()
        return 0
    if serial is None:
        ready = [s for s, state in listed.items() if state == "device"]
        if len(ready) != 1:
            print("adb: more than one device/emulator" if ready else "adb: no devices/emulators found",
                  file=sys.stderr)
            return 1
        serial = ready[0]
    if serial not in listed:
        print(f"adb: device '{serial}' not found", file=sys.stderr)
        return 1
    if listed[serial] != "device":
        print(f"adb: device {listed[serial]}", file=sys.stderr)
        return 1
    if command == "push":
        if len(args) != 2:
            print("adb: push requires SRC and DST", file=sys.stderr)
            return 1
        return push(*args)
    if command == "shell":
        return shell(" ".join(args))
    print(f"adb: unknown command {command}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
