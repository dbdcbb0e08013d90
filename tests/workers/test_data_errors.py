"""Bad data fails the run with an error naming the URL or key and what was expected — never a hang.
Shards live on moto's S3 over HTTP and are read through 2 DataLoader worker processes."""

from __future__ import annotations

import io
import tarfile

import fsspec
import pytest
from torchvision.io import encode_png

from api.data_specs import ImageFolderSpec, WebDatasetSpec
from tests.workers.data_helpers import indexed_image, write_indexed_folder
from workers.data.errors import DataError
from workers.data.image_folder import ImageFolderLoader
from workers.data.webdataset_loader import WebDatasetLoader

pytestmark = pytest.mark.timeout(120)
PNG = encode_png(indexed_image(1, 1)).numpy().tobytes()


def tar_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def good_shard(start: int, count: int = 4) -> bytes:
    files = {}
    for i in range(start, start + count):
        files[f"{i:05d}.png"], files[f"{i:05d}.cls"] = PNG, b"1"
    return tar_bytes(files)


def upload(s3_server, prefix: str, shards: list[bytes]) -> str:
    for index, data in enumerate(shards):
        with fsspec.open(f"{s3_server.url(prefix)}/s-{index}.tar", "wb") as f:
            f.write(data)
    return f"{s3_server.url(prefix)}/s-{{0..{len(shards) - 1}}}.tar"


def read_all(urls: str, *, world_size: int = 1, num_samples: int = 8, **overrides) -> None:
    spec = WebDatasetSpec.model_validate({"name": "webdataset", "urls": urls, "num_samples": num_samples,
                                          "channels": 1, "num_workers": 2, "shuffle_buffer": 4, **overrides})
    for rank in range(world_size):
        list(WebDatasetLoader(spec, batch_size=2 * world_size, rank=rank, world_size=world_size))


def test_a_missing_bucket_names_the_shard(s3_server):
    with pytest.raises(DataError, match=r"shard 's3://no-such-bucket-x/train-0.tar' cannot be opened.*existing tar"):
        read_all("s3://no-such-bucket-x/train-{0..1}.tar")


def test_a_missing_shard_names_it(s3_server):
    urls = upload(s3_server, "err-missing", [good_shard(0), good_shard(4)]).replace("{0..1}", "{0..2}")
    with pytest.raises(DataError, match=r"s-2\.tar' cannot be opened"):
        read_all(urls, num_samples=12)


def test_a_corrupt_tar_names_the_shard(s3_server):
    urls = upload(s3_server, "err-corrupt", [good_shard(0), b"this is not a tar file" * 100])
    with pytest.raises(DataError, match=r"s-1\.tar' is not a readable WebDataset tar"):
        read_all(urls)


def test_a_truncated_tar_names_the_shard(s3_server):
    urls = upload(s3_server, "err-truncated", [good_shard(0), good_shard(4)[:1500]])
    with pytest.raises(DataError, match=r"s-1\.tar' is truncated: it ends after 1500 bytes"):
        read_all(urls)


def test_a_sample_without_its_label_names_the_key(s3_server):
    shard = tar_bytes({"00000.png": PNG, "00000.cls": b"0", "00001.png": PNG, "00002.png": PNG, "00002.cls": b"2"})
    urls = upload(s3_server, "err-label", [shard, good_shard(4)])
    with pytest.raises(DataError, match=r"s-0\.tar': sample '00001' has no \.cls file \(it has \.png\); "
                                        r"expected \.png and \.cls"):
        read_all(urls)


def test_another_image_key_names_what_the_sample_has(s3_server):
    urls = upload(s3_server, "err-key", [good_shard(0), good_shard(4)])
    with pytest.raises(DataError, match=r"has no \.jpg file \(it has \.cls, \.png\)"):
        read_all(urls, image_key="jpg")


def test_an_image_that_does_not_decode_names_the_sample(s3_server):
    shard = tar_bytes({"00000.png": b"\x89PNG but broken", "00000.cls": b"0", "00001.png": PNG, "00001.cls": b"1"})
    urls = upload(s3_server, "err-decode", [shard, shard])
    with pytest.raises(DataError, match=r"sample 's3://.*s-[01]\.tar#00000': cannot decode the image"):
        read_all(urls, num_samples=4)


def test_a_label_that_is_not_a_class_names_the_sample(s3_server):
    shard = tar_bytes({"00000.png": PNG, "00000.cls": b"12", "00001.png": PNG, "00001.cls": b"1"})
    urls = upload(s3_server, "err-class", [shard, shard])
    with pytest.raises(DataError, match=r"#00000': label b'12' is not an integer in \[0, 10\)"):
        read_all(urls, num_samples=4)


def test_fewer_shards_than_ranks_is_refused(s3_server):
    urls = upload(s3_server, "err-ranks", [good_shard(0)]).replace("{0..0}", "0")
    with pytest.raises(DataError, match=r"expand to 1 shard\(s\) but 2 ranks need at least one each"):
        read_all(urls, world_size=2)


def test_a_rank_whose_shards_hold_no_samples_fails_instead_of_waiting(s3_server):
    urls = upload(s3_server, "err-empty", [good_shard(0), tar_bytes({})])
    with pytest.raises(DataError, match=r"s-1\.tar'\] hold no samples"):
        read_all(urls, world_size=2, num_samples=8)


def test_image_folder_errors_name_the_root_or_image(tmp_path, s3_server):
    with pytest.raises(DataError, match=r"root '.*nowhere' does not exist"):
        ImageFolderLoader(ImageFolderSpec(name="image_folder", root=str(tmp_path / "nowhere")), batch_size=2)
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.png").write_bytes(PNG)
    with pytest.raises(DataError, match=r"holds no images in class folders"):
        ImageFolderLoader(ImageFolderSpec(name="image_folder", root=str(tmp_path / "flat")), batch_size=2)
    folder = write_indexed_folder(tmp_path / "bad", 8)
    (folder / "class_0" / "img_00000.png").write_bytes(b"not an image")
    loader = ImageFolderLoader(ImageFolderSpec(name="image_folder", root=str(folder), channels=1), batch_size=8)
    with pytest.raises(DataError, match=r"image '.*class_0/img_00000\.png': cannot decode the image"):
        list(loader)
    with pytest.raises(DataError, match=r"root 's3://no-such-bucket-y/images' does not exist"):
        ImageFolderLoader(ImageFolderSpec(name="image_folder", root="s3://no-such-bucket-y/images"), batch_size=2)
