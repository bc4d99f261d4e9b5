// UTF-8 validity, for what the interposer writes as JSON (findings) and the
// offline JSON parser (analyze/json.h) alike.
#pragma once

#include <cstddef>

namespace allocscope {

// Length of the valid UTF-8 sequence at `p` (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF), 0 when it is not one.
size_t utf8_sequence(const unsigned char* p, size_t left) noexcept;

}  // namespace allocscope
