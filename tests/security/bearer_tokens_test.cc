// Bearer tokens: the file format, lookups against a plain map kept by the test, and
// reloads of the tokens file (server side) and of a client's token file.
#include "common/security/bearer_tokens.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "common/security/client_token.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

using testing::FreshSeed;

std::string RandomToken(std::mt19937_64& rng, int length = 32) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~+/=";
  std::string token;
  for (int i = 0; i < length; ++i) token += kChars[rng() % (sizeof(kChars) - 1)];
  return token;
}

void WriteFile(const std::string& path, const std::string& text) {
  // Through a rename, as an operator's tooling (or a Kubernetes secret) replaces a file.
  const std::string temp = path + ".new";
  std::ofstream(temp) << text;
  std::filesystem::rename(temp, path);
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(FreshSeed()))).string();
}

TEST(TokenTableTest, FindsExactlyTheTokensItHoldsWithTheirRoles) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<std::string, uint8_t>> role_sets = {
      {"client", 1}, {"worker", 2}, {"admin", 4}, {"worker,admin", 6}, {"client,worker,admin", 7}};
  std::map<std::string, std::pair<std::string, uint8_t>> expected;  // token -> (name, roles)
  std::string text = "# fleet tokens\n\n";
  for (int i = 0; i < 40; ++i) {
    const std::string token = RandomToken(rng, 16 + static_cast<int>(rng() % 48));
    const auto& [roles_text, roles] = role_sets[rng() % role_sets.size()];
    const std::string name = "principal-" + std::to_string(i);
    expected[token] = {name, roles};
    text += token + (rng() % 2 ? "\t" : "  ") + name + " " + roles_text + (rng() % 3 == 0 ? "  # comment\n" : "\n");
  }
  absl::StatusOr<TokenTable> table = TokenTable::Parse(text);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), expected.size());
  for (const auto& [token, want] : expected) {
    std::optional<Principal> found = table->Find(token);
    ASSERT_TRUE(found.has_value()) << token;
    EXPECT_EQ(found->name, want.first);
    EXPECT_EQ(found->roles, want.second);
    EXPECT_EQ(found->Has(Role::kWorker), (want.second & 2) != 0);
    // Near misses are not the token: a prefix, an extension, one character changed.
    EXPECT_FALSE(table->Find(token.substr(0, token.size() - 1)).has_value());
    EXPECT_FALSE(table->Find(token + "x").has_value());
    std::string changed = token;
    changed[rng() % changed.size()] ^= 1;
    if (!expected.contains(changed)) {
      EXPECT_FALSE(table->Find(changed).has_value());
    }
  }
  EXPECT_FALSE(table->Find("").has_value());
}

TEST(TokenTableTest, RefusesMalformedFilesNamingTheLine) {
  const std::string good = "0123456789abcdef0123 alice worker\n";
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {good + "short alice2 worker\n", "line 2: token shorter than 16"},
      {good + "0123456789abcdef9999 bob\n", "line 2: expected TOKEN NAME ROLE"},
      {good + "0123456789abcdef9999 bob root\n", "line 2: unknown role 'root'"},
      {good + "0123456789abcdef9999 bob worker,\n", "line 2: unknown role ''"},
      {good + "0123456789abcdef9999 alice admin\n", "line 2: name 'alice' given twice"},
      {good + "# x\n0123456789abcdef0123 carol admin\n", "line 3: token given twice"},
      {good + "0123456789abcdef99\x01"
              "9 dave admin\n",
       "line 2: token holds a character outside printable ASCII"},
      {good + "0123456789abcdef9999 bob worker extra\n", "line 2: expected TOKEN NAME ROLE"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TokenTable> table = TokenTable::Parse(c.text);
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(table.status().message().find(c.message), std::string::npos) << table.status();
  }
}

TEST(TokenFileTest, PicksUpAddedAndRevokedTokensAndKeepsTheOldOnesOnABadEdit) {
  std::mt19937_64 rng(FreshSeed());
  const std::string path = TempPath("tokens");
  const std::string alice = RandomToken(rng), bob = RandomToken(rng), carol = RandomToken(rng);
  WriteFile(path, alice + " alice worker\n" + bob + " bob admin\n");
  auto file = TokenFile::Open(path, std::chrono::milliseconds(0));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Find(alice)->name, "alice");
  EXPECT_FALSE((*file)->Find(carol).has_value());

  // Bob is revoked, Carol added.
  WriteFile(path, alice + " alice worker\n" + carol + " carol client\n");
  EXPECT_FALSE((*file)->Find(bob).has_value());
  EXPECT_EQ((*file)->Find(carol)->name, "carol");

  // An edit that does not parse leaves the last good tokens in force.
  WriteFile(path, alice + " alice superuser\n");
  EXPECT_EQ((*file)->Find(carol)->name, "carol");
  EXPECT_TRUE((*file)->Find(alice)->Has(Role::kWorker));
  std::filesystem::remove(path);
  EXPECT_EQ((*file)->Find(carol)->name, "carol");
}

TEST(TokenFileTest, OpenRefusesMissingEmptyOrMalformedFiles) {
  const std::string path = TempPath("tokens");
  EXPECT_EQ(TokenFile::Open(path, std::chrono::seconds(1)).status().code(), absl::StatusCode::kNotFound);
  WriteFile(path, "# nobody\n");
  EXPECT_NE(TokenFile::Open(path, std::chrono::seconds(1)).status().message().find("no tokens"), std::string::npos);
  WriteFile(path, "tooshort a worker\n");
  EXPECT_NE(TokenFile::Open(path, std::chrono::seconds(1)).status().message().find(path), std::string::npos);
  std::filesystem::remove(path);
}

TEST(TokenFileTest, ChecksTheFileNoMoreOftenThanItsInterval) {
  std::mt19937_64 rng(FreshSeed());
  const std::string path = TempPath("tokens");
  const std::string alice = RandomToken(rng), bob = RandomToken(rng);
  WriteFile(path, alice + " alice worker\n");
  auto file = TokenFile::Open(path, std::chrono::hours(1));
  ASSERT_TRUE(file.ok());
  WriteFile(path, bob + " bob worker\n");
  EXPECT_TRUE((*file)->Find(alice).has_value());  // not checked again within the hour
  EXPECT_FALSE((*file)->Find(bob).has_value());
  std::filesystem::remove(path);
}

TEST(ClientTokenTest, FollowsTheFileAndKeepsTheLastTokenWhenItDisappears) {
  std::mt19937_64 rng(FreshSeed());
  const std::string path = TempPath("token");
  ClientToken token(path, std::chrono::milliseconds(0));
  EXPECT_EQ(token.Current(), "");
  const std::string first = RandomToken(rng), second = RandomToken(rng);
  WriteFile(path, first + "\n");
  EXPECT_EQ(token.Current(), first);
  WriteFile(path, "  " + second + "\n\n");
  EXPECT_EQ(token.Current(), second);
  std::filesystem::remove(path);
  EXPECT_EQ(token.Current(), second);
}

}  // namespace
}  // namespace lazykv
