#pragma once
// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104): what the rendezvous uses to check that a peer
// knows the job's secret without sending it, and to fingerprint what the ranks of a job must
// agree on (parallel/store.h, parallel/job_check.h). Not for bulk data: checkpoints use CRC-32.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace mt {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest sha256(std::string_view data);
Sha256Digest hmac_sha256(std::string_view key, std::string_view message);

// Lower-case hex, 64 digits.
std::string to_hex(const Sha256Digest& d);

}  // namespace mt
