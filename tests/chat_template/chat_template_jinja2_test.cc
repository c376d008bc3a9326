// The chat-template engine against an independent implementation: Python's Jinja2
// (python3-jinja2, run as /usr/bin/python3 tests/chat_template/jinja2_render.py, set up as
// transformers sets it up). Fresh random conversations (a printed seed; LAZYKV_CHAT_SEED
// replays one) with roles in and out of order, unicode, whitespace that templates trim,
// quotes, braces and special-token text in contents, tool calls and tools, rendered with
// realistic templates: Llama 3 (as published, and with the add_generation_prompt test),
// ChatML, a Mistral-style one (system message sliced off, raise_exception on roles out of
// order, loop.last), a Qwen2.5-style one (tools through tojson, tool responses grouped by
// looking at neighbours), and one that uses most of the engine (namespace, macros, filters,
// tests, methods, break/continue, for-if, for-else, slicing, arithmetic).
// Each case must agree: the same text, or both an error (raise_exception with the same
// message). Skips when python3 or its jinja2 module is missing.
//
// Bugs these catch: any divergence in whitespace handling, scoping, string methods on
// unicode (code point slicing, Python's whitespace set), tojson formatting, number
// printing, or error behaviour on conversations real clients send.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "worker/chat_template/chat_template.h"
#include "worker/chat_template/evaluator.h"

namespace lazykv {
namespace {

using json = nlohmann::json;

constexpr char kPython[] = "/usr/bin/python3";

const char* const kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}";

const char* const kLlama3Conditional =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

const char* const kMistral = R"TPL({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.last and system_message is defined %}
            {{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content']|trim + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)TPL";

const char* const kQwen = R"TPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)TPL";

// Not a published template: one that reaches most of the engine, written the way chat
// templates are (indented tags with `-`, macros, namespaces).
const char* const kKitchenSink = R"TPL({#- Touches most of the engine. -#}
{%- set ns = namespace(turns=0, last_user='', sys=none) %}
{%- if messages and messages[0].role == 'system' %}
  {%- set ns.sys = messages[0].content | trim %}
  {%- set rest = messages[1:] %}
{%- else %}
  {%- set rest = messages %}
{%- endif %}
{%- macro header(role, n, mark='#') -%}
<<{{ role | upper }}{{ mark }}{{ n }}>>
{%- endmacro %}
{{- bos_token }}
{%- if ns.sys is not none %}
[SYS {{ ns.sys | length }}] {{ ns.sys }}
{% endif %}
{%- for m in rest if m.role != 'tool' %}
  {%- set ns.turns = ns.turns + 1 %}
  {%- set text = m.content if m.content is string else '' %}
  {%- if m.role == 'user' %}{% set ns.last_user = text %}{% endif %}
{{ header(m.role, loop.index) }} {{ loop.revindex0 }}/{{ loop.length }}{% if loop.first %} first{% endif %}{% if loop.last %} last{% endif %}

  {%- if text.strip().startswith('/') %}
 command={{ text.strip()[1:].split()|first|default('none') }}
  {%- elif '{' in text or '}' in text %}
 braces={{ text | replace('{', '(') | replace('}', ')') | trim }}
  {%- elif text | length > 12 %}
 long={{ text[:6] ~ '...' ~ text[-3:] }} words={{ text.split() | length }}
  {%- else %}
 {{ text | trim | tojson }}
  {%- endif %}
  {%- if m.tool_calls is defined %}
    {%- for call in m.tool_calls %}
 call {{ call.function.name }}({{ call.function.arguments | tojson(sort_keys=true) }})
      {%- if not loop.last %},{% endif %}
    {%- endfor %}
  {%- endif %}
{% else %}
(no turns)
{% endfor %}
{%- set roles = messages | map(attribute='role') | unique | list %}
roles={{ roles | join(',') }} users={{ messages | selectattr('role', 'equalto', 'user') | list | length }}
{%- if ns.last_user %} last={{ ns.last_user[-5:] | tojson }}{% endif %}
 turns={{ ns.turns }} {{ ns.turns * 1.5 }} {{ ns.turns // 2 }} {{ ns.turns % 3 }} {{ ns.turns is even }}
{% for m in messages %}
  {%- if loop.index > 4 %}{% break %}{% endif %}
  {%- if m.role == 'system' %}{% continue %}{% endif %}
  {{- m.role[0] }}{{ '-' if not loop.last }}
{%- endfor %}
{%- if tools is not none %}
tools: {{ tools | map(attribute='function.name') | join(', ') }}
{{ tools[0] | tojson(indent=2) }}
{%- endif %}
{%- if add_generation_prompt %}
{{ header('assistant', ns.turns + 1, mark='@') }}
{% endif %}
)TPL";

struct NamedTemplate {
  const char* name;
  std::string source;
};

std::vector<NamedTemplate> Templates() {
  return {{"llama3", kLlama3},
          {"llama3_conditional", kLlama3Conditional},
          {"chatml", std::string(kChatMlTemplate)},
          {"mistral", kMistral},
          {"qwen2.5", kQwen},
          {"kitchen_sink", kKitchenSink}};
}

std::string RandomText(std::mt19937_64& rng) {
  static const char* const kPieces[] = {"hello",      "world",      " ",        "  ",    "\n",     "\n\n",   "\t",
                                        "café",       "你好",       "🦙",     "ß",     "\u00a0", "\u3000", "'",
                                        "\"",         "{{ x }}",    "{% if %}", "{#",    "}}",     "{",      "\\",
                                        "<|eot_id|>", "<|im_end|>", "[INST]",   "ÉCOLE", "x",      "42",     "3.14",
                                        "/help",      "\r\n",       "\u2028",   "\x1f",  "ok.",    "Why?",   "é"};
  std::uniform_int_distribution<int> count(0, 9);
  std::uniform_int_distribution<size_t> pick(0, std::size(kPieces) - 1);
  std::string text;
  for (int i = count(rng); i > 0; --i) text += kPieces[pick(rng)];
  return text;
}

json RandomArguments(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> coin(0, 3);
  json args = json::object();
  args["city"] = coin(rng) ? "Paris" : "São Paulo \"SP\"";
  if (coin(rng)) args["days"] = std::uniform_int_distribution<int>(-5, 400)(rng);
  if (coin(rng)) args["ratio"] = std::vector<double>{0.1, 2.5, 1e-7, 100.0, 1e22, -0.0}[coin(rng)];
  if (coin(rng) == 0) args["flags"] = {true, nullptr, "a<b>&c"};
  return args;
}

json RandomConversation(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> coin(0, 9);
  const int n = std::uniform_int_distribution<int>(0, 7)(rng);
  const bool well_formed = coin(rng) < 6;
  json messages = json::array();
  bool system = coin(rng) < 5;
  for (int i = 0; i < n; ++i) {
    std::string role;
    if (well_formed) {
      role = (i == 0 && system) ? "system" : (((i - (system ? 1 : 0)) % 2 == 0) ? "user" : "assistant");
    } else {
      static const char* const kRoles[] = {"system", "user", "assistant", "tool", "user", "assistant"};
      role = kRoles[std::uniform_int_distribution<int>(0, 5)(rng)];
    }
    json message = {{"role", role}, {"content", RandomText(rng)}};
    if (role == "assistant" && coin(rng) < 2) {
      json calls = json::array();
      for (int c = std::uniform_int_distribution<int>(1, 2)(rng); c > 0; --c) {
        calls.push_back(
            {{"type", "function"},
             {"function", {{"name", coin(rng) < 5 ? "get_weather" : "search"}, {"arguments", RandomArguments(rng)}}}});
      }
      message["tool_calls"] = calls;
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

json RandomTools(std::mt19937_64& rng) {
  json tools = json::array();
  for (int t = std::uniform_int_distribution<int>(1, 2)(rng); t > 0; --t) {
    tools.push_back(
        {{"type", "function"},
         {"function",
          {{"name", t == 1 ? "get_weather" : "search"},
           {"description", "Looks things up — fast & \"safely\"."},
           {"parameters",
            {{"type", "object"},
             {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}, {"minimum", 0}}}}},
             {"required", {"city"}}}}}}});
  }
  return tools;
}

bool Jinja2Available() {
  const std::string command = std::string(kPython) + " -c 'import jinja2' >/dev/null 2>&1";
  return std::filesystem::exists(kPython) && std::system(command.c_str()) == 0;
}

// The reference's results for `cases` (one per case, see jinja2_render.py).
json RunJinja2(const json& cases) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("chat_template_jinja2_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "in.json") << json{{"cases", cases}}.dump();
  const std::string command = std::string(kPython) + " " + LAZYKV_JINJA2_SCRIPT + " < " + (dir / "in.json").string() +
                              " > " + (dir / "out.json").string();
  const int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << command;
  std::ifstream in(dir / "out.json");
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove_all(dir);
  return json::parse(text.str(), nullptr, false);
}

TEST(ChatTemplateJinja2Test, RandomConversationsRenderAsJinja2Does) {
  if (!Jinja2Available()) GTEST_SKIP() << kPython << " has no jinja2 module (apt-get install python3-jinja2)";
  uint64_t seed = testing::FreshSeed();
  if (const char* env = std::getenv("LAZYKV_CHAT_SEED"); env != nullptr && *env) seed = std::strtoull(env, nullptr, 10);
  std::printf("chat template random seed: %llu (LAZYKV_CHAT_SEED=%llu replays it)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);

  const std::vector<NamedTemplate> templates = Templates();
  std::vector<ChatTemplate> compiled;
  for (const NamedTemplate& t : templates) {
    absl::StatusOr<ChatTemplate> c = ChatTemplate::FromString(t.source, "<s>", "</s>");
    ASSERT_TRUE(c.ok()) << t.name << ": " << c.status();
    compiled.push_back(*std::move(c));
  }
  struct Case {
    size_t tpl;
    json messages;
    bool add_generation_prompt;
    json extra;
  };
  std::vector<Case> cases;
  json reference_cases = json::array();
  for (int conversation = 0; conversation < 150; ++conversation) {
    const json messages = RandomConversation(rng);
    const bool with_tools = std::uniform_int_distribution<int>(0, 3)(rng) == 0;
    json extra = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    if (with_tools) extra["tools"] = RandomTools(rng);
    for (size_t t = 0; t < templates.size(); ++t) {
      const bool agp = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
      cases.push_back({t, messages, agp, extra});
      json variables = extra;
      variables["messages"] = messages;
      variables["add_generation_prompt"] = agp;
      if (!with_tools) variables["tools"] = nullptr;
      variables["documents"] = nullptr;
      reference_cases.push_back({{"template", templates[t].source}, {"variables", variables}});
    }
  }
  const json expected = RunJinja2(reference_cases);
  ASSERT_TRUE(expected.is_array() && expected.size() == cases.size()) << "the reference gave no usable answer";

  int rendered = 0, both_failed = 0, raised = 0, mismatches = 0;
  for (size_t i = 0; i < cases.size() && mismatches < 5; ++i) {
    const Case& c = cases[i];
    absl::StatusOr<std::string> ours = compiled[c.tpl].Render(c.messages, c.add_generation_prompt, c.extra);
    const json& want = expected[i];
    const std::string context = std::string("template ") + templates[c.tpl].name +
                                ", add_generation_prompt=" + (c.add_generation_prompt ? "true" : "false") +
                                ", messages=" + c.messages.dump();
    if (want.contains("ok")) {
      ++rendered;
      if (!ours.ok() || *ours != want["ok"].get<std::string>()) {
        ++mismatches;
        ADD_FAILURE() << context << "\n  jinja2: " << want["ok"].dump()
                      << "\n  ours:   " << (ours.ok() ? json(*ours).dump() : ours.status().ToString());
      }
      continue;
    }
    ++both_failed;
    if (ours.ok()) {
      ++mismatches;
      ADD_FAILURE() << context << "\n  jinja2 failed: " << want["error"] << "\n  ours rendered: " << json(*ours).dump();
      continue;
    }
    if (want["raised"].get<bool>()) {
      ++raised;
      EXPECT_EQ(jinja::RaisedMessage(ours.status()), want["error"].get<std::string>()) << context;
    }
  }
  std::printf("%d rendered identically, %d failed in both (%d by raise_exception with the same message)\n", rendered,
              both_failed, raised);
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(rendered, static_cast<int>(cases.size()) / 2);  // most cases are not errors
  EXPECT_GT(raised, 0);                                     // the Mistral template's checks ran
}

}  // namespace
}  // namespace lazykv
