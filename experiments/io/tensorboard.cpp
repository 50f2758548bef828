// TensorBoard event files (tensorboard.h): the protobuf wire format (varints,
// fixed 32/64-bit, length-delimited fields) of the Event messages, and the
// writer, which frames each as a record (records.h).
#include "tensorboard.h"

#include "files.h"
#include "records.h"

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <system_error>

namespace bigbatch::experiments::tensorboard {
namespace {

using records::little_endian;
using records::read_little_endian;

// ------------------------------------------------------------ protobuf write --
enum WireType : std::uint32_t { kVarint = 0, kFixed64 = 1, kLength = 2, kFixed32 = 5 };

void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void key(std::string& out, std::uint32_t field, WireType type) { varint(out, (field << 3) | type); }

void length_field(std::string& out, std::uint32_t field, std::string_view bytes) {
  key(out, field, kLength);
  varint(out, bytes.size());
  out += bytes;
}

std::string scalar_value(const Event::Scalar& s) {
  std::string v;
  length_field(v, 1, s.tag);
  std::uint32_t bits;
  std::memcpy(&bits, &s.value, sizeof bits);
  key(v, 2, kFixed32);
  v += little_endian(bits);
  return v;
}

std::string text_value(const Event::Text& t) {
  std::string plugin, metadata, tensor, v;
  length_field(plugin, 1, "text");       // PluginData.plugin_name
  length_field(metadata, 1, plugin);     // SummaryMetadata.plugin_data
  key(tensor, 1, kVarint);               // TensorProto.dtype
  varint(tensor, 7);                     // DT_STRING
  length_field(tensor, 2, "");           // tensor_shape: a scalar
  length_field(tensor, 8, t.markdown);   // string_val
  length_field(v, 1, t.tag);
  length_field(v, 8, tensor);
  length_field(v, 9, metadata);
  return v;
}

// ------------------------------------------------------------- protobuf read --
// One message's fields in order; throws on malformed bytes.
class FieldReader {
 public:
  explicit FieldReader(std::string_view bytes) : bytes_(bytes) {}

  bool next() {
    if (pos_ == bytes_.size()) return false;
    const std::uint64_t k = read_varint();
    field_ = static_cast<std::uint32_t>(k >> 3);
    type_ = static_cast<std::uint32_t>(k & 7);
    if (field_ == 0) throw std::runtime_error("protobuf: field number 0");
    switch (type_) {
      case kVarint: number_ = read_varint(); break;
      case kFixed64: number_ = read_little_endian<std::uint64_t>(take(8)); break;
      case kFixed32: number_ = read_little_endian<std::uint32_t>(take(4)); break;
      case kLength: {
        const std::uint64_t n = read_varint();
        if (n > bytes_.size() - pos_) throw std::runtime_error("protobuf: a field runs past the message's end");
        bytes_field_ = take(static_cast<std::size_t>(n));
        break;
      }
      default: throw std::runtime_error("protobuf: unknown wire type " + std::to_string(type_));
    }
    return true;
  }

  std::uint32_t field() const { return field_; }
  std::uint32_t type() const { return type_; }
  std::uint64_t number() const { return number_; }
  std::string_view bytes() const { return bytes_field_; }

 private:
  std::uint64_t read_varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const auto b = static_cast<unsigned char>(take(1)[0]);
      v |= std::uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return v;
    }
    throw std::runtime_error("protobuf: a varint longer than 10 bytes");
  }

  std::string_view take(std::size_t n) {
    if (n > bytes_.size() - pos_) throw std::runtime_error("protobuf: message cut short");
    const auto out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }

  std::string_view bytes_;
  std::size_t pos_ = 0;
  std::uint32_t field_ = 0, type_ = 0;
  std::uint64_t number_ = 0;
  std::string_view bytes_field_;
};

// The Value's text, when its tensor is a DT_STRING (field 8, string_val).
std::string tensor_text(std::string_view tensor) {
  std::string text;
  for (FieldReader r(tensor); r.next();) {
    if (r.field() == 8 && r.type() == kLength) text += r.bytes();
  }
  return text;
}

void parse_value(std::string_view bytes, Event& event) {
  std::string tag;
  std::optional<float> simple;
  std::optional<std::string> text;
  for (FieldReader r(bytes); r.next();) {
    if (r.field() == 1 && r.type() == kLength) {
      tag = r.bytes();
    } else if (r.field() == 2 && r.type() == kFixed32) {
      const auto bits = static_cast<std::uint32_t>(r.number());
      float f;
      std::memcpy(&f, &bits, sizeof f);
      simple = f;
    } else if (r.field() == 8 && r.type() == kLength) {
      text = tensor_text(r.bytes());
    }
  }
  if (simple) event.scalars.push_back({tag, *simple});
  if (text) event.texts.push_back({tag, *text});
}

}  // namespace

const char* const kEventFileName = "events.out.tfevents.bigbatch";

std::string serialize(const Event& event) {
  std::string out, summary;
  key(out, 1, kFixed64);
  std::uint64_t bits;
  std::memcpy(&bits, &event.wall_time, sizeof bits);
  out += little_endian(bits);
  key(out, 2, kVarint);
  varint(out, static_cast<std::uint64_t>(event.step));
  if (!event.file_version.empty()) length_field(out, 3, event.file_version);
  for (const auto& s : event.scalars) length_field(summary, 1, scalar_value(s));
  for (const auto& t : event.texts) length_field(summary, 1, text_value(t));
  if (!summary.empty()) length_field(out, 5, summary);
  return out;
}

Event parse_event(std::string_view bytes) {
  Event event;
  for (FieldReader r(bytes); r.next();) {
    if (r.field() == 1 && r.type() == kFixed64) {
      const std::uint64_t bits = r.number();
      std::memcpy(&event.wall_time, &bits, sizeof bits);
    } else if (r.field() == 2 && r.type() == kVarint) {
      event.step = static_cast<std::int64_t>(r.number());
    } else if (r.field() == 3 && r.type() == kLength) {
      event.file_version = r.bytes();
    } else if (r.field() == 5 && r.type() == kLength) {
      for (FieldReader s(r.bytes()); s.next();) {
        if (s.field() == 1 && s.type() == kLength) parse_value(s.bytes(), event);
      }
    }
  }
  return event;
}

// ------------------------------------------------------------------ writer --

EventWriter::EventWriter(const std::string& folder, std::int64_t keep_through)
    : path_((std::filesystem::path(folder) / kEventFileName).string()) {
  std::string kept;
  if (keep_through >= 0 && std::filesystem::exists(path_)) {
    const std::string bytes = read_file(path_);
    std::size_t end = 0;
    for (const auto& payload : records::read_records(bytes).payloads) {
      try {
        if (parse_event(payload).step > keep_through) break;
      } catch (const std::runtime_error&) {
        break;
      }
      end += 16 + payload.size();
    }
    kept = bytes.substr(0, end);
  }
  // The kept records replace the file whole (a temporary renamed over it).
  write_file_atomic(path_, kept);
  out_ = AppendFile(path_);
  if (kept.empty()) {
    Event first;
    first.file_version = "brain.Event:2";
    write(first);
  }
}

void EventWriter::write(Event event) {
  event.wall_time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  out_.write(records::frame(serialize(event)));
}

void EventWriter::scalar(const std::string& tag, std::int64_t step, double value) {
  scalars(step, {{tag, static_cast<float>(value)}});
}

void EventWriter::scalars(std::int64_t step, const std::vector<Event::Scalar>& values) {
  Event event;
  event.step = step;
  event.scalars = values;
  write(std::move(event));
}

void EventWriter::text(const std::string& tag, std::int64_t step, const std::string& markdown) {
  Event event;
  event.step = step;
  event.texts.push_back({tag, markdown});
  write(std::move(event));
}

}  // namespace bigbatch::experiments::tensorboard
