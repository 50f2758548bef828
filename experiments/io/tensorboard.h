// TensorBoard event files, written without TensorFlow. Torch-free.
//
// An event file is a sequence of TFRecords (records.h), each payload one
// serialized tensorflow.Event protobuf. Only the
// few fields this writer uses are encoded, by their published field numbers:
//   Event          wall_time 1 (double), step 2 (int64), file_version 3 (string),
//                  summary 5 (Summary)
//   Summary        value 1 (repeated Value)
//   Value          tag 1 (string), simple_value 2 (float), tensor 8 (TensorProto),
//                  metadata 9 (SummaryMetadata)
//   SummaryMetadata plugin_data 1 (PluginData: plugin_name 1)
//   TensorProto    dtype 1 (DT_STRING = 7), tensor_shape 2, string_val 8
// TensorBoard takes every file whose name holds "tfevents" as a run's events,
// and a folder's path below --logdir as the run's name.
#pragma once

#include "files.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bigbatch::experiments::tensorboard {

/// An Event as this writer writes it.
struct Event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;  ///< set in the first event of a file only
  struct Scalar {
    std::string tag;
    float value = 0;
  };
  struct Text {
    std::string tag, markdown;
  };
  std::vector<Scalar> scalars;
  std::vector<Text> texts;
};

/// Event <-> protobuf bytes. parse_event reads the fields listed at the top
/// and skips any other; it throws std::runtime_error on bytes that are not a
/// well-formed protobuf message.
std::string serialize(const Event& event);
Event parse_event(std::string_view bytes);

/// The file name of a folder's events: "events.out.tfevents.bigbatch".
extern const char* const kEventFileName;

/// Appends events to <folder>/events.out.tfevents.bigbatch. A file already
/// there (a run that was interrupted) keeps its whole records of steps up to
/// `keep_through` and loses the rest, so a run resumed from a checkpoint at
/// that step writes each later step once; keep_through < 0 starts a new file.
/// Every call writes whole records; a failure names the file and the reason.
class EventWriter {
 public:
  explicit EventWriter(const std::string& folder, std::int64_t keep_through = -1);

  void scalar(const std::string& tag, std::int64_t step, double value);
  /// Scalars sharing a step, as one event.
  void scalars(std::int64_t step, const std::vector<Event::Scalar>& values);
  /// Markdown for TensorBoard's Text tab.
  void text(const std::string& tag, std::int64_t step, const std::string& markdown);

  const std::string& path() const { return path_; }

 private:
  void write(Event event);

  std::string path_;
  AppendFile out_;
};

}  // namespace bigbatch::experiments::tensorboard
