// flatbuffers/flexbuffers.h as the op library includes it (attrs.cc, the fuzz target): one
// configuration, so that every file sees the same definitions of the header's inline functions.
#ifndef DIFFLITE_FLEXBUFFERS_CONFIG_H_
#define DIFFLITE_FLEXBUFFERS_CONFIG_H_

// Never abort inside the header on odd data: the buffer is verified before any value is read,
// and every failure is reported as a string.
#ifndef FLATBUFFERS_ASSERT
#define FLATBUFFERS_ASSERT(x) ((void)0)
#endif
// Header-only use: the locale-independent number parsing would need libflatbuffers'
// ClassicLocale; the library never parses numbers from strings.
#ifndef FLATBUFFERS_LOCALE_INDEPENDENT
#define FLATBUFFERS_LOCALE_INDEPENDENT 0
#endif
#include <flatbuffers/flexbuffers.h>

#endif  // DIFFLITE_FLEXBUFFERS_CONFIG_H_
