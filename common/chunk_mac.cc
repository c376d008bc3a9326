#include "common/chunk_mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace lazykv {

absl::StatusOr<std::shared_ptr<const ChunkMac>> ChunkMac::FromKeyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("chunk MAC key file %s: cannot open it", path));
  std::stringstream content;
  content << in.rdbuf();
  const std::string key(absl::StripAsciiWhitespace(content.str()));
  if (key.size() < 32) {
    return absl::InvalidArgumentError(
        absl::StrFormat("chunk MAC key file %s: %d bytes of secret, at least 32 are needed", path, key.size()));
  }
  return std::make_shared<const ChunkMac>(key);
}

std::array<uint8_t, kChunkMacBytes> ChunkMac::Sign(const ChunkHeader& header,
                                                   std::span<const std::string_view> payload) const {
  ChunkHeader unsigned_header = header;
  unsigned_header.mac = {};
  const std::string header_bytes = EncodeChunkHeader(unsigned_header);
  std::array<uint8_t, kChunkMacBytes> tag{};
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* ctx = mac != nullptr ? EVP_MAC_CTX_new(mac) : nullptr;
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  size_t length = 0;
  bool ok = ctx != nullptr &&
            EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key_.data()), key_.size(), params) == 1 &&
            EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(header_bytes.data()),
                           kChunkMacCoveredHeaderBytes) == 1;
  for (std::string_view piece : payload) {
    ok = ok && EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(piece.data()), piece.size()) == 1;
  }
  ok = ok && EVP_MAC_final(ctx, tag.data(), &length, tag.size()) == 1 && length == tag.size();
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  if (!ok) tag.fill(0);  // never a valid tag: Verify fails closed
  return tag;
}

absl::Status ChunkMac::Verify(const ChunkHeader& header, std::span<const std::string_view> payload) const {
  const std::array<uint8_t, kChunkMacBytes> expected = Sign(header, payload);
  const bool zero = std::all_of(expected.begin(), expected.end(), [](uint8_t b) { return b == 0; });
  if (zero || CRYPTO_memcmp(expected.data(), header.mac.data(), expected.size()) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "chunk %s: its MAC does not match (not signed with this fleet's key, or altered)", header.key.ToHex()));
  }
  return absl::OkStatus();
}

}  // namespace lazykv
