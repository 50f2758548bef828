// TensorBoard event files and their record framing (records.h): CRC32C
// against the published check values, the protobuf bytes of an event against
// a hand encoding, records cut short at every byte, and a resumed writer
// dropping the steps after its checkpoint.
// Torch-free (it runs in the sanitizer lane too). The real `tensorboard`
// package reads the files back in tests/experiments/tensorboard_read.py.
#include "../../experiments/io/files.h"
#include "../../experiments/io/records.h"
#include "../../experiments/io/tensorboard.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace {

using namespace bigbatch::experiments::tensorboard;
using namespace bigbatch::experiments::records;
namespace fs = std::filesystem;

std::string bytes_of(std::initializer_list<int> values) {
  std::string s;
  for (int v : values) s += static_cast<char>(v);
  return s;
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

fs::path fresh_folder(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("bigbatch_tb_" + name + "_" + std::to_string(::getpid()));
  bigbatch::experiments::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

// RFC 3720 (iSCSI), appendix B.4, and the common "123456789" check value.
TEST(TensorBoard, Crc32cMatchesPublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up += static_cast<char>(i);
    down += static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(TensorBoard, MaskedCrcRotatesRight15AndAddsTheConstant) {
  // crc32c("123456789") = 0xE3069283; rotated right by 15 bits: 0x2507C60D;
  // plus 0xa282ead8 (mod 2^32): 0xC78AB0E5.
  EXPECT_EQ(masked_crc32c("123456789"), 0xC78AB0E5u);
}

TEST(TensorBoard, ScalarEventBytesMatchAHandEncoding) {
  Event e;
  e.wall_time = 1.0;  // 0x3FF0000000000000
  e.step = 300;       // varint AC 02
  e.scalars.push_back({"a", 1.0f});  // 0x3F800000
  const std::string expected = bytes_of({
      0x09, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F,      // 1: wall_time, fixed64
      0x10, 0xAC, 0x02,                        // 2: step, varint
      0x2A, 0x0A,                              // 5: summary, 10 bytes
      0x0A, 0x08,                              //   1: value, 8 bytes
      0x0A, 0x01, 'a',                         //     1: tag
      0x15, 0x00, 0x00, 0x80, 0x3F});          //     2: simple_value, fixed32
  EXPECT_EQ(serialize(e), expected);
  const Event back = parse_event(expected);
  EXPECT_EQ(back.step, 300);
  EXPECT_EQ(back.wall_time, 1.0);
  ASSERT_EQ(back.scalars.size(), 1u);
  EXPECT_EQ(back.scalars[0].tag, "a");
  EXPECT_EQ(back.scalars[0].value, 1.0f);
}

TEST(TensorBoard, TextEventCarriesTheTextPluginAndAStringTensor) {
  Event e;
  e.step = 7;
  e.texts.push_back({"table", "| b | steps |"});
  const std::string bytes = serialize(e);
  EXPECT_NE(bytes.find(bytes_of({0x0A, 0x04}) + "text"), std::string::npos);  // plugin_name
  EXPECT_NE(bytes.find(bytes_of({0x08, 0x07})), std::string::npos);           // dtype DT_STRING
  const Event back = parse_event(bytes);
  ASSERT_EQ(back.texts.size(), 1u);
  EXPECT_EQ(back.texts[0].tag, "table");
  EXPECT_EQ(back.texts[0].markdown, "| b | steps |");
  EXPECT_TRUE(back.scalars.empty());
}

TEST(TensorBoard, RecordFramingIsLengthCrcPayloadCrc) {
  const std::string r = frame("abc");
  ASSERT_EQ(r.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(r.substr(0, 8), bytes_of({3, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r.substr(12, 3), "abc");
  const std::uint32_t crc = masked_crc32c("abc");
  EXPECT_EQ(r.substr(15), bytes_of({static_cast<int>(crc & 0xFF), static_cast<int>((crc >> 8) & 0xFF),
                                    static_cast<int>((crc >> 16) & 0xFF), static_cast<int>(crc >> 24)}));
}

TEST(TensorBoard, ACutTailYieldsEveryWholeRecordBeforeIt) {
  const std::string a = frame("first"), b = frame("second record"), c = frame("");
  const std::string all = a + b + c;
  for (std::size_t cut = 0; cut <= all.size(); ++cut) {
    const Records r = read_records(std::string_view(all).substr(0, cut));
    const std::size_t whole = cut >= a.size() + b.size() + c.size() ? 3 : cut >= a.size() + b.size() ? 2
                              : cut >= a.size()                     ? 1
                                                                    : 0;
    ASSERT_EQ(r.payloads.size(), whole) << "cut at " << cut;
    EXPECT_EQ(r.whole_bytes, whole == 0 ? 0 : whole == 1 ? a.size() : whole == 2 ? a.size() + b.size() : all.size());
  }
  EXPECT_EQ(read_records(all).payloads[1], "second record");
}

TEST(TensorBoard, AFlippedByteEndsTheReadAtTheRecordBeforeIt) {
  const std::string a = frame("first"), b = frame("second");
  for (std::size_t i = a.size(); i < a.size() + b.size(); ++i) {
    std::string bad = a + b;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    EXPECT_EQ(read_records(bad).payloads.size(), 1u) << "byte " << i;
  }
}

TEST(TensorBoard, MalformedProtobufIsAnErrorNotACrash) {
  EXPECT_THROW(parse_event(bytes_of({0x2A, 0x05, 0x0A})), std::runtime_error);  // length past the end
  EXPECT_THROW(parse_event(bytes_of({0x0B})), std::runtime_error);              // wire type 3
  EXPECT_THROW(parse_event(bytes_of({0x10, 0x80})), std::runtime_error);        // varint cut short
  EXPECT_THROW(parse_event(std::string(11, '\x80')), std::runtime_error);       // varint too long
}

std::vector<Event> events_in(const fs::path& file) {
  std::vector<Event> out;
  for (const auto& p : read_records(read(file)).payloads) out.push_back(parse_event(p));
  return out;
}

TEST(TensorBoard, WriterStartsWithTheFileVersionAndAppendsWholeRecords) {
  const auto dir = fresh_folder("writer");
  {
    EventWriter w(dir.string());
    w.scalars(10, {{"train/loss", 0.5f}, {"lr", 0.1f}});
    w.text("steps_to_target", 10, "| b |");
  }
  const auto events = events_in(dir / kEventFileName);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[1].step, 10);
  ASSERT_EQ(events[1].scalars.size(), 2u);
  EXPECT_EQ(events[1].scalars[1].tag, "lr");
  EXPECT_EQ(events[1].scalars[1].value, 0.1f);
  EXPECT_GT(events[1].wall_time, 1.6e9);  // seconds since 1970, in 2020 or later
  EXPECT_EQ(events[2].texts.at(0).markdown, "| b |");
  bigbatch::experiments::remove_tree(dir);
}

TEST(TensorBoard, AResumedWriterDropsTheStepsAfterItsCheckpointAndACutTail) {
  const auto dir = fresh_folder("resume");
  {
    EventWriter w(dir.string());
    for (int step = 50; step <= 200; step += 50) w.scalar("val/loss", step, step / 100.0);
  }
  {  // a killed write: half a record at the end
    std::ofstream out(dir / kEventFileName, std::ios::binary | std::ios::app);
    out << frame(serialize(Event{})).substr(0, 9);
  }
  {
    EventWriter w(dir.string(), /*keep_through=*/100);
    w.scalar("val/loss", 150, 9.0);
  }
  auto events = events_in(dir / kEventFileName);
  ASSERT_EQ(events.size(), 4u);  // version, 50, 100, the new 150
  EXPECT_EQ(events[2].step, 100);
  EXPECT_EQ(events[3].step, 150);
  EXPECT_EQ(events[3].scalars.at(0).value, 9.0f);
  EXPECT_EQ(read_records(read(dir / kEventFileName)).whole_bytes, fs::file_size(dir / kEventFileName));

  { EventWriter w(dir.string()); }  // a trial started over: a new file
  events = events_in(dir / kEventFileName);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  bigbatch::experiments::remove_tree(dir);
}

}  // namespace
