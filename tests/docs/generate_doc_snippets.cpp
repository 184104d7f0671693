// Turns every ```cpp block of the documentation into code the test build compiles, so a snippet
// that no longer compiles against volt's API fails the build (pointing at the Markdown line,
// through #line), and the whole programs among them run as a test (tests/docs/doc_snippets.cpp).
//
// A block's mode is given by an HTML comment on the line before its fence (invisible when the
// Markdown is rendered); without one a block is a fragment of a function body:
//   <!-- doc-test: body -->                     statements, compiled in a member function of a
//                                               class derived from volt_doc::Scope (doc_scope.h),
//                                               whose members are the names fragments use
//   <!-- doc-test: body returns TYPE -->        the same, in a function returning TYPE
//   <!-- doc-test: member -->                   member functions of a class derived from Scope
//                                               (a Module's training_step, say)
//   <!-- doc-test: file -->                     declarations at namespace scope (its own
//                                               namespace, where doc_scope.h's MyModel and
//                                               MyData are visible)
//   <!-- doc-test: program -->                  a whole program: compiled like `file`, and its
//                                               main() is run by the doc_programs test in an empty
//                                               folder
//   <!-- doc-test: program creates PATH -->     the same, and PATH must exist after it ran
//   <!-- doc-test: skip REASON -->              not compiled (REASON is required)
// #include lines inside a block are moved to the top of the generated file (blank lines keep the
// numbering), so a block may include the header it needs.
//
// Usage: generate_doc_snippets SOURCE_DIR OUTPUT.cpp FILE.md...   (FILE.md relative to
// SOURCE_DIR; the relative name is what #line and the errors show). Exit 1 with
// "FILE.md:LINE: what is wrong" on a malformed block or marker.
//
// Plain C++17 without libtorch: it builds in a second.

#include <cctype>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Block {
  std::string file;  // relative to the source folder
  int fence_line = 0;
  std::string mode;      // body | member | file | program | skip
  std::string argument;  // body: the return type; program: the path it creates; skip: the reason
  std::vector<std::string> lines;
};

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

[[noreturn]] void fail(const std::string& file, int line, const std::string& what) {
  throw std::runtime_error(file + ":" + std::to_string(line) + ": " + what);
}

// Reads the mode of the marker `text` ("<!-- doc-test: ... -->") into `block`.
void parse_marker(const std::string& text, const std::string& file, int line, Block& block) {
  const std::string open = "<!-- doc-test:";
  const std::string close = "-->";
  if (text.size() < open.size() + close.size() ||
      text.compare(text.size() - close.size(), close.size(), close) != 0) {
    fail(file, line, "a doc-test marker is one line, \"<!-- doc-test: MODE -->\"");
  }
  const std::string body = trim(text.substr(open.size(), text.size() - open.size() - close.size()));
  const auto space = body.find(' ');
  block.mode = body.substr(0, space);
  block.argument = space == std::string::npos ? "" : trim(body.substr(space));
  if (block.mode == "body") {
    if (!block.argument.empty()) {
      if (!starts_with(block.argument, "returns ")) {
        fail(file, line, "\"body\" takes only \"returns TYPE\", got \"" + block.argument + "\"");
      }
      block.argument = trim(block.argument.substr(8));
    }
  } else if (block.mode == "program") {
    if (!block.argument.empty()) {
      if (!starts_with(block.argument, "creates ")) {
        fail(file, line, "\"program\" takes only \"creates PATH\", got \"" + block.argument + "\"");
      }
      block.argument = trim(block.argument.substr(8));
    }
  } else if (block.mode == "file" || block.mode == "member") {
    if (!block.argument.empty()) fail(file, line, "\"" + block.mode + "\" takes no argument");
  } else if (block.mode == "skip") {
    if (block.argument.empty()) fail(file, line, "\"skip\" needs a reason: skip REASON");
  } else {
    fail(file, line,
         "unknown doc-test mode \"" + block.mode + "\"; use body, member, file, program or skip");
  }
}

std::vector<Block> read_blocks(const std::string& root, const std::string& file) {
  std::ifstream in(root + "/" + file);
  if (!in) throw std::runtime_error(file + ": cannot be read");
  std::vector<Block> blocks;
  std::string line, previous;  // previous: the last non-blank line outside a block
  int number = 0, previous_number = 0;
  Block* open = nullptr;
  while (std::getline(in, line)) {
    ++number;
    const std::string t = trim(line);
    if (open != nullptr) {
      if (starts_with(t, "```")) {
        open = nullptr;
        previous.clear();
      } else {
        open->lines.push_back(line);
      }
      continue;
    }
    if (t == "```cpp" || t == "```c++" || t == "```cxx") {
      Block b;
      b.file = file;
      b.fence_line = number;
      b.mode = "body";
      if (starts_with(previous, "<!-- doc-test:")) parse_marker(previous, file, previous_number, b);
      blocks.push_back(std::move(b));
      open = &blocks.back();
      continue;
    }
    if (starts_with(previous, "<!-- doc-test:") && !t.empty()) {
      fail(file, previous_number, "a doc-test marker belongs on the line before a ```cpp fence");
    }
    if (starts_with(t, "<!-- doc-test:")) {
      Block check;
      parse_marker(t, file, number, check);  // malformed markers fail here, not silently
    }
    if (!t.empty()) {
      previous = t;
      previous_number = number;
    }
    if (starts_with(t, "```")) previous.clear();  // another language's block
  }
  if (open != nullptr) fail(file, open->fence_line, "this ```cpp block is never closed");
  return blocks;
}

// "README.md" line 65 -> "README_md_65": a namespace name per block.
std::string block_id(const Block& b) {
  std::string id;
  for (char c : b.file) id += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return "doc_" + id + "_" + std::to_string(b.fence_line);
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: generate_doc_snippets SOURCE_DIR OUTPUT.cpp FILE.md...\n";
    return 2;
  }
  try {
    const std::string root = argv[1];
    std::vector<Block> blocks;
    for (int i = 3; i < argc; ++i) {
      for (auto& b : read_blocks(root, argv[i])) blocks.push_back(std::move(b));
    }
    std::set<std::string> includes;
    for (auto& b : blocks) {
      if (b.mode == "skip") continue;
      for (auto& l : b.lines) {
        if (starts_with(trim(l), "#include")) {
          includes.insert(trim(l));
          l.clear();
        }
      }
    }
    std::ostringstream out;
    out << "// Generated by tests/docs/generate_doc_snippets.cpp from the ```cpp blocks of the\n"
           "// documentation; do not edit. Errors point at the Markdown lines.\n"
           "#include \"doc_scope.h\"\n";
    for (const auto& inc : includes) out << inc << "\n";
    std::ostringstream programs;
    int compiled = 0, skipped = 0;
    for (const auto& b : blocks) {
      if (b.mode == "skip") {
        ++skipped;
        out << "\n// " << b.file << ":" << b.fence_line << " skipped: " << b.argument << "\n";
        continue;
      }
      ++compiled;
      const std::string id = block_id(b);
      out << "\nnamespace " << id << " {\n";
      if (b.mode == "body") {
        const std::string type = b.argument.empty() ? "void" : b.argument;
        out << "struct Fragment : volt_doc::Scope {\n  " << type << " run();\n};\n"
            << type << " Fragment::run() {\n";
      } else if (b.mode == "member") {
        out << "struct Fragment : volt_doc::Scope {\n";
      } else if (b.mode == "file") {
        out << "using namespace volt_doc;\n";
      }
      out << "#line " << b.fence_line + 1 << " " << quoted(b.file) << "\n";
      for (const auto& l : b.lines) out << l << "\n";
      if (b.mode == "body") out << "}\n";
      if (b.mode == "member") out << "};\n";
      out << "}  // namespace " << id << "\n";
      if (b.mode == "program") {
        programs << "      {" << quoted(b.file + ":" + std::to_string(b.fence_line)) << ", "
                 << quoted(b.argument) << ", [] { return volt_doc::call_main(&" << id
                 << "::main); }},\n";
      }
    }
    out << "\nstd::vector<volt_doc::Program> volt_doc::programs() {\n  return {\n"
        << programs.str() << "  };\n}\n";
    out << "\nint volt_doc::compiled_blocks() { return " << compiled << "; }\n";
    // Written only when it changed, so an edit elsewhere in the docs recompiles nothing.
    const std::string text = out.str();
    std::string before;
    {
      std::ifstream old(argv[2]);
      if (old) before.assign(std::istreambuf_iterator<char>(old), {});
    }
    if (before != text) {
      std::ofstream f(argv[2]);
      f << text;
      if (!f) throw std::runtime_error(std::string(argv[2]) + ": cannot be written");
    }
    std::cout << "doc snippets: " << compiled << " blocks compiled, " << skipped << " skipped\n";
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
