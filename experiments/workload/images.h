// The image workloads of the batch-size literature, registered as any
// user's datasets (workload.h): CIFAR-10 and CIFAR-100 from their binary
// files ("cifar10", "cifar100"), and folders of JPEG and PNG images in
// torchvision's ImageFolder layout ("image_folder"), with the papers'
// augmentation drawn per (seed, epoch, example): random crop of the image
// padded by 4 pixels and horizontal flip for CIFAR (He et al. 2016), random
// resized crop and flip for folders (Szegedy et al. 2015, as torchvision
// does it), per-channel normalization for both. docs/workloads.md "Image
// workloads" gives the parameters, the splits and where the files come from.
#pragma once

#include "workload.h"

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// "cifar10" / "cifar100": the binary version's files under `path`.
struct CifarSpec {
  std::int64_t classes = 10;  ///< 10 or 100
  std::string path;           ///< the folder of data_batch_1..5.bin, test_batch.bin (or train.bin, test.bin)
  std::int64_t validation = 5000;  ///< training records held out for validation (Shallue et al.'s 45k/5k)
  std::uint64_t split_seed = 0;    ///< which ones: a permutation drawn from this seed
  bool augment = true;             ///< random crop (4-pixel zero padding) and horizontal flip while training
  bool fine_labels = true;         ///< cifar100: the 100 fine labels, else the 20 coarse ones
};

/// "image_folder": path/<class>/<image>, classes in sorted folder order.
struct ImageFolderSpec {
  std::string path;             ///< the training images
  std::string validation_path;  ///< empty: validation_fraction of path's images, drawn by split_seed
  std::string test_path;        ///< optional
  double validation_fraction = 0.1;
  std::uint64_t split_seed = 0;
  std::int64_t size = 224;    ///< the square side the model sees
  std::int64_t resize = 256;  ///< evaluation: the shorter side scaled to this, then the center size x size
  bool augment = true;        ///< random resized crop (scale 0.08-1, ratio 3/4-4/3) and flip while training
  bool verify = true;         ///< decode every image once at load, skipping (and counting) the corrupt ones
  std::array<double, 3> mean{0.485, 0.456, 0.406};  ///< per channel (RGB), of pixels scaled to [0, 1]
  std::array<double, 3> std{0.229, 0.224, 0.225};
};

WorkloadData load_cifar(const CifarSpec& spec);
WorkloadData load_image_folder(const ImageFolderSpec& spec);

/// Nothing when `path` is a folder; else std::runtime_error "<key>: <path>:
/// not a folder" or "...: cannot open (No such file or directory)".
void require_folder(const std::string& path, const char* key);

/// The registrations "cifar10", "cifar100" and "image_folder".
std::vector<DatasetRegistration> image_datasets();

// ----------------------------------------------- augmentation, exposed --
// The geometry the datasets apply, public so that tests and a user's own
// image workload can use the same.

/// image (uint8 [C, H, W]) padded by `pad` zeros on each side, the H x W
/// window at row dy, column dx of the padded image (each in [0, 2 pad]),
/// mirrored left-right when `flip`.
at::Tensor pad_crop_flip(const at::Tensor& image, std::int64_t pad, std::int64_t dy, std::int64_t dx, bool flip);

/// A crop window in an image: rows [top, top + height), columns [left, left + width).
struct CropBox {
  std::int64_t top = 0, left = 0, height = 0, width = 0;
};
/// The random resized crop's window for an H x W image (torchvision's
/// algorithm): up to 10 draws of an area fraction in [scale_min, scale_max]
/// and a log-uniform aspect ratio in [ratio_min, ratio_max] until the window
/// fits, else the whole image cropped centrally to the nearest allowed ratio.
CropBox random_resized_box(std::int64_t height, std::int64_t width, ExampleRandom& random, double scale_min = 0.08,
                           double scale_max = 1.0, double ratio_min = 3.0 / 4.0, double ratio_max = 4.0 / 3.0);

/// Python's round(): halves to even, as torchvision's window arithmetic.
std::int64_t round_half_even(double x);

/// uint8 images [N, C, H, W] as float, scaled to [0, 1] and standardized per
/// channel: (x / 255 - mean[c]) / std[c].
at::Tensor normalize_images(const at::Tensor& images, const std::vector<double>& mean, const std::vector<double>& std);
/// The same, bit for bit, computed in the calling thread alone: what the
/// loader's threads use, so that none of them starts a team of the trial's
/// intra-op threads of its own.
at::Tensor normalize_images_serial(const at::Tensor& images, const std::vector<double>& mean,
                                   const std::vector<double>& std);

}  // namespace bigbatch::experiments
