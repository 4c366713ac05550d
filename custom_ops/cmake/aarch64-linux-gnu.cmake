# CMake toolchain file: cross-compile the op library for 64-bit Arm Linux with the GNU
# cross toolchain (Debian/Ubuntu: apt-get install g++-aarch64-linux-gnu).
#
#   cmake -S custom_ops -B build-aarch64 \
#         -DCMAKE_TOOLCHAIN_FILE=custom_ops/cmake/aarch64-linux-gnu.cmake \
#         -DDIFFLITE_FLATBUFFERS_INCLUDE_DIR=DIR   # DIR/flatbuffers/flexbuffers.h
#
# The target sysroot (/usr/aarch64-linux-gnu) has no flatbuffers; the headers are
# architecture-independent, so point DIFFLITE_FLATBUFFERS_INCLUDE_DIR at a folder that holds
# only flatbuffers/ (not at the host's /usr/include, whose C headers would shadow the
# target's). scripts/cross_compile_check.sh does that.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(DIFFLITE_CROSS_PREFIX "aarch64-linux-gnu-" CACHE STRING "Prefix of the cross tools")
set(DIFFLITE_CROSS_SYSROOT "/usr/aarch64-linux-gnu" CACHE PATH "Target root searched for libraries")

set(CMAKE_C_COMPILER "${DIFFLITE_CROSS_PREFIX}gcc")
set(CMAKE_CXX_COMPILER "${DIFFLITE_CROSS_PREFIX}g++")

# Search the target root for libraries and headers, the host for programs.
set(CMAKE_FIND_ROOT_PATH "${DIFFLITE_CROSS_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
