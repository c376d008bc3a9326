// The chat-template engine's rules, each against a literal expected string (the ones marked
// "Jinja2" were produced by Python Jinja2 3.1 with transformers' settings, trim_blocks and
// lstrip_blocks), its refusals, its limits, and the ChatTemplate API (loading from
// tokenizer_config.json, content parts, the ChatML fallback).
#include "worker/chat_template/chat_template.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/chat_template/evaluator.h"
#include "worker/chat_template/parser.h"

namespace lazykv {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

absl::StatusOr<std::string> Render(std::string_view source, const json& variables = json::object(),
                                   const jinja::RenderLimits& limits = {}) {
  absl::StatusOr<std::shared_ptr<const jinja::Program>> program = jinja::Parse(source);
  if (!program.ok()) return program.status();
  jinja::Value vars = jinja::Value::FromJson(variables);
  return jinja::Render(**program, vars.dict(), limits);
}

std::string MustRender(std::string_view source, const json& variables = json::object()) {
  absl::StatusOr<std::string> out = Render(source, variables);
  EXPECT_TRUE(out.ok()) << source << ": " << out.status();
  return out.ok() ? *out : "<error>";
}

// Whitespace control, each expected string from Jinja2. Catches: lstrip applied after an
// expression or mid-line, trim_blocks applied to `}}`, `-` not stripping newlines, `+` not
// disabling the strip, the template's trailing newline kept, CRLF kept.
TEST(ChatTemplateTest, WhitespaceControlMatchesJinja2) {
  EXPECT_EQ(MustRender("  {% if true %}\n  x\n  {% endif %}\n  {{ 1 }}  {% if true %}y{% endif %}\n"), "  x\n  1  y");
  EXPECT_EQ(MustRender("a\n{#- c -#}\n b {# c #}\n c\n {%+ if 1 %} x {% endif +%}\ny"), "ab  c\n  x \ny");
  EXPECT_EQ(MustRender("{% for i in [1,2] %}\n{{ i }}\n{% endfor %}\n"), "1\n2\n");
  EXPECT_EQ(MustRender("x  \n  {{- 'a' -}}  \n  y"), "xay");
  EXPECT_EQ(MustRender("a\r\nb\r\n\r\n"), "a\nb\n");
  EXPECT_EQ(MustRender("x  {% if 1 %}y{% endif %}"), "x  y");
  EXPECT_EQ(MustRender("a\n\t{% if 1 %}\tb\n{% endif %}c"), "a\n\tb\nc");
  EXPECT_EQ(MustRender("{{ 'a' }}\n{{ 'b' }}"), "a\nb");
  EXPECT_EQ(MustRender("  {% raw %}{{ x }}{% endraw %}\n."), "{{ x }}.");
  EXPECT_EQ(MustRender("{{ {'a': {'b': 1}} }}"), "{'a': {'b': 1}}");
}

// Scoping as Jinja2 (each expected from Jinja2). Catches: a set in a loop leaking out or
// into the next iteration, namespace attributes not shared, macros binding variables at
// definition instead of at call time.
TEST(ChatTemplateTest, ScopingMatchesJinja2) {
  EXPECT_EQ(MustRender("{% set x = 0 %}{% for i in [1,2] %}{{ x }}{% set x = x + 1 %}{{x}}{% endfor %}{{x}}"), "01010");
  EXPECT_EQ(MustRender("{% for i in [1,2] %}{% if i == 2 %}{{ y }}{% endif %}{% set y = i %}{% endfor %}{{y}}"), "");
  EXPECT_EQ(
      MustRender("{% set ns = namespace(x=0) %}{% for i in [1,2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"),
      "3");
  EXPECT_EQ(MustRender("{% set x = 5 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 6 %}{{ m() }}"), "6");
  EXPECT_EQ(MustRender("{% macro f(a, b='x') %}[{{a}}{{b}}]{% endmacro %}{{ f(1) }}{{ f(1, b=2) }}{{ f(b=3, a=4) }}"),
            "[1x][12][43]");
  EXPECT_EQ(MustRender("{% if true %}{% set z = 1 %}{% endif %}{{ z }}"), "1");
  EXPECT_EQ(MustRender("{% set s %}a{{ 1 + 1 }}{% endset %}[{{ s }}]"), "[a2]");
}

// Loops (each expected from Jinja2). Catches: loop.length / index counting unfiltered items,
// else not run for an empty or undefined iterable, break/continue misplaced, unpacking.
TEST(ChatTemplateTest, LoopsMatchJinja2) {
  EXPECT_EQ(MustRender("{% for m in [1,2,3] if m != 2 %}{{ loop.index }}{{ loop.last }}{{ loop.length }}{% endfor %}"),
            "1False22True2");
  EXPECT_EQ(MustRender("{% for x in u %}a{% else %}b{% endfor %}"), "b");
  EXPECT_EQ(MustRender("{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}"
                       "{% endif %}{{ i }}{% endfor %}"),
            "023");
  EXPECT_EQ(MustRender("{% for a, b in {'x': 1, 'y': 2}.items() %}{{a}}={{b}};{% endfor %}"), "x=1;y=2;");
  EXPECT_EQ(MustRender("{% for c in 'hé' %}{{ loop.revindex0 }}{{ c }}{% endfor %}"), "1h0é");
  EXPECT_EQ(MustRender("{% for x in [1, 2] %}{{ loop.previtem is defined }}{{ loop.nextitem }}{% endfor %}"),
            "False2True");
}

// Values printed as Python prints them (each expected from Jinja2). Catches: float
// formatting (3.0, 1e+16), reprs of lists and dicts with quotes, Python's integer division
// and modulo signs, undefined printing as "".
TEST(ChatTemplateTest, ExpressionsMatchJinja2) {
  EXPECT_EQ(MustRender("{{ 1/2 }} {{ 3/1 }} {{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 7//2 }} "
                       "{{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 2.5 ~ 1 }}"),
            "0.5 3.0 1e+20 1e+16 1000000000000000.0 0.0001 1e-05 3 -4 2 1024 2.51");
  EXPECT_EQ(MustRender("{{ [1,'a',\"b'\", none, true, 1.5, {'k': [1]}] }}"),
            "[1, 'a', \"b'\", None, True, 1.5, {'k': [1]}]");
  EXPECT_EQ(MustRender("{{ x['y'] }}|{{ x }}|{{ u }}|{{ u is defined }}", {{"x", json::object()}}), "|{}||False");
  EXPECT_EQ(Render("{{ x['y'] }}").status().code(), absl::StatusCode::kInvalidArgument);  // 'x' is undefined
  EXPECT_EQ(MustRender("{{ 'abc'[1:] }} {{ 'abc'[-1] }} {{ [1,2,3][::-1] }} {{ 'héllo'[1] }} {{ [1,2,3][-2:] }}"),
            "bc c [3, 2, 1] é [2, 3]");
  EXPECT_EQ(MustRender("{{ none ~ 1 }} {{ true }} {{ None }} {{ True }} {{ 'a' 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"),
            "None1 True None True ab True False");
  EXPECT_EQ(MustRender("{{ -2|abs }} {{ not 1 in [1] }} {{ 1 if 0 else 2 if 0 else 3 }} {{ (none if false) is none }}"),
            "2 False 3 False");
  EXPECT_EQ(MustRender("{{ (1,2) }} {{ 'x'*3 }} {{ [1]*2 }} {{ 7.5 // 2 }} {{ 2**-1 }} {{ true + 1 }}"),
            "[1, 2] xxx [1, 1] 3.0 0.5 2");  // a tuple prints as a list here; Jinja2 prints (1, 2)
  EXPECT_EQ(MustRender("{{ x.0 }}{{ x[1] }}{{ x[5] }}", {{"x", {5, 6}}}), "56");
}

// Filters, tests and methods (each expected from Jinja2, tojson as transformers defines it).
// Catches: default applied to None, HTML escaping in tojson, split/strip semantics,
// selectattr/map plumbing, indent's first-line rule.
TEST(ChatTemplateTest, FiltersTestsAndMethodsMatchJinja2) {
  EXPECT_EQ(MustRender("{{ x | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} "
                       "{{ none | default('d') }}"),
            "d  d None");
  EXPECT_EQ(MustRender("{{ '  a b  '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b'.split(none, 1) }}"),
            "['a', 'b'] ['a', 'b', '', 'c'] ['a', 'b']");
  EXPECT_EQ(MustRender("{{ range(3)|list }} {{ 'a-b'.split('-', 1) }} {{ '  x '.lstrip() }}|{{ 'xxaxx'.strip('x') }}"),
            "[0, 1, 2] ['a', 'b'] x |a");
  EXPECT_EQ(
      MustRender(
          "{{ {'b':1, 'a':2}|tojson }} {{ 1.0|tojson }} {{ '<é\\n'|tojson }} {{ 'é'|tojson(ensure_ascii=true) }}"),
      "{\"b\": 1, \"a\": 2} 1.0 \"<é\\n\" \"\\u00e9\"");
  EXPECT_EQ(MustRender("{{ [1,2]|tojson(indent=2) }}|{{ {}|tojson(indent=2) }}|{{ {'b':[], 'a':1}|tojson(indent=2, "
                       "sort_keys=true) }}"),
            "[\n  1,\n  2\n]|{}|{\n  \"a\": 1,\n  \"b\": []\n}");
  const json msgs = {{"messages", {{{"role", "system"}, {"content", "s"}}, {{"role", "user"}, {"content", "u"}}}}};
  EXPECT_EQ(
      MustRender(
          "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}"
          "{{ messages|rejectattr('role', '==', 'user')|list|length }}{{ messages|map(attribute='role')|first|upper }}",
          msgs),
      "u1SYSTEM");
  EXPECT_EQ(MustRender("{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'x'|indent(2, true) }}"), "a\n  b\n\n  c|  x");
  EXPECT_EQ(MustRender("{{ ' Hi There '|trim|lower }}{{ 'ab'.startswith('a') }}{{ 'ab'.endswith(('x', 'b')) }}"
                       "{{ 'hello world'|title }}{{ 'aXb'|replace('X', '-') }}{{ [3, 1]|reverse|list }}"),
            "hi thereTrueTrueHello Worlda-b[1, 3]");
  EXPECT_EQ(MustRender("{{ 1 is number }}{{ 'a' is string }}{{ {} is mapping }}{{ 3 is odd }}{{ 4 is divisibleby 2 }}"
                       "{{ x is not defined }}{{ none is none }}{{ 1 is integer }}{{ 1.0 is float }}"),
            "TrueTrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(MustRender("{{ d.get('a') }}{{ d.get('z', 0) }}{{ d.keys()|list }}{{ d['a'] }}{{ d.a }}{{ '\\u00e9' }}",
                       {{"d", {{"a", 1}}}}),
            "10['a']11é");
  EXPECT_EQ(MustRender("{{ '\\u00a0 x\\u3000'|trim }}|{{ 'x' ~ '\\t'|trim }}|{{ '12'|int + 1 }}{{ 'z'|int }}"),
            "x|x|130");
}

absl::Status StatusOf(std::string_view source, const json& variables = json::object(),
                      const jinja::RenderLimits& limits = {}) {
  return Render(source, variables, limits).status();
}

// Refusals at parse time name the construct and where it is. Catches: an unknown filter or
// tag silently passed through or rendered as text, an unclosed block accepted, errors that
// do not say where.
TEST(ChatTemplateTest, ParseErrorsNameTheConstructAndLine) {
  absl::Status s = StatusOf("ok\n{% if x %}never closed");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("line 2"));
  EXPECT_THAT(s.message(), HasSubstr("unclosed '{% if %}'"));
  EXPECT_THAT(StatusOf("{{ x ").message(), HasSubstr("unclosed '{{'"));
  EXPECT_THAT(StatusOf("a {# b").message(), HasSubstr("unclosed comment"));
  EXPECT_THAT(StatusOf("{{ 'abc }}").message(), HasSubstr("unterminated string"));
  s = StatusOf("\n\n{{ x | frobnicate }}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unknown filter 'frobnicate'"));
  EXPECT_THAT(s.message(), HasSubstr("line 3"));
  EXPECT_THAT(StatusOf("{{ x is frob }}").message(), HasSubstr("unknown test 'frob'"));
  EXPECT_THAT(StatusOf("{% include 'x.j2' %}").message(), HasSubstr("unsupported tag 'include'"));
  EXPECT_THAT(StatusOf("{% extends 'x.j2' %}").message(), HasSubstr("unsupported tag 'extends'"));
  EXPECT_THAT(StatusOf("{% for x in y recursive %}{% endfor %}").message(), HasSubstr("recursive"));
  EXPECT_THAT(StatusOf("{% endfor %}").message(), HasSubstr("unexpected '{% endfor %}'"));
  EXPECT_THAT(StatusOf("{% for x in y %}{% endif %}").message(), HasSubstr("unexpected '{% endif %}'"));
  EXPECT_THAT(StatusOf("{% break %}").message(), HasSubstr("outside a for loop"));
  EXPECT_THAT(StatusOf("{{ f(*args) }}").message(), HasSubstr("*args"));
  EXPECT_THAT(StatusOf("{{ 1 $ 2 }}").message(), HasSubstr("unexpected character '$'"));
  EXPECT_THAT(StatusOf("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}").message(),
              HasSubstr("nested too deeply"));
  EXPECT_THAT(StatusOf(std::string(300, ' ') +
                       [] {
                         std::string s;
                         for (int i = 0; i < 300; ++i) s += "{% if 1 %}";
                         return s;
                       }())
                  .message(),
              HasSubstr("nested too deeply"));
}

// Render errors: raise_exception's message reaches the caller; type errors and undefined
// values name the line. Catches: raise_exception ignored or its message lost, undefined
// silently usable as an operand.
TEST(ChatTemplateTest, RenderErrorsSurfaceWithTheirMessage) {
  absl::Status s = StatusOf("{% if true %}\n{{ raise_exception('Roles must alternate user/assistant') }}{% endif %}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("Roles must alternate user/assistant"));
  EXPECT_THAT(s.message(), HasSubstr("line 2"));
  EXPECT_EQ(jinja::RaisedMessage(s), "Roles must alternate user/assistant");
  EXPECT_EQ(jinja::RaisedMessage(StatusOf("{{ 'a' + 1 }}")), std::nullopt);
  EXPECT_THAT(StatusOf("{{ 'a' + 1 }}").message(), HasSubstr("unsupported operand types for +: 'str' and 'int'"));
  EXPECT_THAT(StatusOf("{{ x.y.z }}").message(), HasSubstr("'x' is undefined"));
  EXPECT_THAT(StatusOf("{{ x.y.z }}", {{"x", json::object()}}).message(), HasSubstr("has no attribute 'y'"));
  EXPECT_THAT(StatusOf("{{ u + 1 }}").message(), HasSubstr("'u' is undefined"));
  EXPECT_THAT(StatusOf("{{ 'a'.frob() }}").message(), HasSubstr("has no method 'frob'"));
  EXPECT_THAT(StatusOf("{{ 1 < 'a' }}").message(), HasSubstr("cannot order"));
  EXPECT_THAT(StatusOf("{% for x in none %}{% endfor %}").message(), HasSubstr("not iterable"));
  EXPECT_THAT(StatusOf("{{ 1 // 0 }}").message(), HasSubstr("by zero"));
  EXPECT_THAT(StatusOf("{{ 9223372036854775807 + 1 }}").message(), HasSubstr("overflow"));
}

// Limits. Catches: output, strings, loops or macro recursion growing without bound.
TEST(ChatTemplateTest, LimitsStopRunawayTemplates) {
  jinja::RenderLimits small;
  small.max_output_bytes = 1000;
  absl::Status s = StatusOf("{% for i in range(100) %}{{ 'xxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", json::object(), small);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("1000 bytes"));
  EXPECT_TRUE(Render("{% for i in range(50) %}{{ 'xxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", json::object(), small).ok());
  // A string that doubles each iteration passes the 16 MiB default cap before any output.
  EXPECT_EQ(StatusOf("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}")
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusOf("{{ 'x' * 100000000 }}").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusOf("{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusOf("{{ range(100000000)|length }}").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusOf("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").code(),
            absl::StatusCode::kResourceExhausted);
}

// The API: tokenizer_config.json shapes, special tokens as objects, content parts, the
// variables transformers passes, and the ChatML fallback. Catches: the list form of
// chat_template not picking "default", bos_token printed as a JSON object, content parts
// passed as a list (Python would print its repr), tools undefined instead of None.
TEST(ChatTemplateTest, LoadsTokenizerConfigShapes) {
  const json config = {{"chat_template",
                        {{{"name", "tool_use"}, {"template", "TOOLS"}},
                         {{"name", "default"}, {"template", "{{ bos_token }}|{{ eos_token }}"}}}},
                       {"bos_token", {{"content", "<s>"}, {"lstrip", false}, {"__type", "AddedToken"}}},
                       {"eos_token", "</s>"}};
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromTokenizerConfig(config);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->Render(json::array(), false), "<s>|</s>");
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig({{"bos_token", "<s>"}}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(
      ChatTemplate::FromTokenizerConfig({{"chat_template", {{{"name", "x"}, {"template", "y"}}}}}).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig({{"chat_template", "{% if %}"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig({{"chat_template", "x"}, {"bos_token", 3}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, ChatMlAndContentParts) {
  absl::StatusOr<ChatTemplate> chatml = ChatTemplate::FromString(kChatMlTemplate);
  ASSERT_TRUE(chatml.ok()) << chatml.status();
  const json messages = {
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hello"}}, {{"type", "text"}, {"text", "there"}}}}}};
  EXPECT_EQ(
      *chatml->Render(messages, true),
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello\nthere<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*chatml->Render(std::vector<ChatMessage>{{"user", "hi"}}, false), "<|im_start|>user\nhi<|im_end|>\n");
  const json image = {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}};
  EXPECT_THAT(chatml->Render(image, true).status().message(), HasSubstr("only {\"type\": \"text\""));
  EXPECT_EQ(chatml->Render(json::array({{{"content", "no role"}}}), true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chatml->Render(json::object(), true).status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<ChatTemplate> vars = ChatTemplate::FromString("{{ tools is none }}{{ documents is defined }}{{ x }}");
  ASSERT_TRUE(vars.ok());
  EXPECT_EQ(*vars->Render(json::array(), false), "TrueTrue");
  EXPECT_EQ(*vars->Render(json::array(), false, {{"x", 7}, {"tools", json::array()}}), "FalseTrue7");
  EXPECT_EQ(vars->Render(json::array(), false, {{"messages", 1}}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, ModelDirectoryFallsBackToChatMl) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("chat_template_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  absl::StatusOr<ChatTemplate> fallback = ChatTemplate::FromModelDirectory(dir.string());
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_TRUE(fallback->is_fallback());
  EXPECT_EQ(fallback->source(), kChatMlTemplate);
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "A{{ eos_token }}", "eos_token": "E"})";
  absl::StatusOr<ChatTemplate> config = ChatTemplate::FromModelDirectory(dir.string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->is_fallback());
  EXPECT_EQ(*config->Render(json::array(), false), "AE");
  std::ofstream(dir / "chat_template.jinja") << "B{{ eos_token }}\n";
  absl::StatusOr<ChatTemplate> jinja_file = ChatTemplate::FromModelDirectory(dir.string());
  ASSERT_TRUE(jinja_file.ok()) << jinja_file.status();
  EXPECT_EQ(*jinja_file->Render(json::array(), false), "BE");
  std::filesystem::remove_all(dir);
}

// One template, many threads rendering at once (namespaces are per render). Catches state
// shared between renders: a namespace or loop counter kept in the template.
TEST(ChatTemplateTest, ConcurrentRendersAreIndependent) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromString(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}{{ ns.n "
      "}}");
  ASSERT_TRUE(t.ok());
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      json messages = json::array();
      for (int j = 0; j <= i; ++j) messages.push_back({{"role", "user"}, {"content", std::to_string(i)}});
      const std::string expected = std::string(i + 1, static_cast<char>('0' + i)) + std::to_string(i + 1);
      for (int k = 0; k < 200; ++k) {
        absl::StatusOr<std::string> out = t->Render(messages, false);
        if (!out.ok() || *out != expected) ++wrong;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace lazykv
