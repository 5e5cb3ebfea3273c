"""Where the remote's endpoint, region and credentials come from: the AWS variables
first, then the profile's credentials file, then its config file; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from ovspec.errors import StoreError
from ovspec.store.awsconfig import DEFAULT_REGION, resolve
from ovspec.store.remote import RemoteConfig, open_remote


def write(home: Path, name: str, text: str) -> None:
    (home / ".aws").mkdir(exist_ok=True)
    (home / ".aws" / name).write_text(text)


def test_nothing_configured_leaves_it_to_obstore(tmp_path: Path) -> None:
    found = resolve({}, tmp_path)
    assert not found.has_keys and found.endpoint is None and found.region == DEFAULT_REGION


def test_variables_win_over_files(tmp_path: Path) -> None:
    write(
        tmp_path, "credentials", "[default]\naws_access_key_id = FILE\naws_secret_access_key = f\n"
    )
    env = {
        "AWS_ACCESS_KEY_ID": "ENV",
        "AWS_SECRET_ACCESS_KEY": "e",
        "AWS_SESSION_TOKEN": "tok",
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL_S3": "http://s3only:9000",
        "AWS_ENDPOINT_URL": "http://all:9000",
    }
    found = resolve(env, tmp_path)
    assert (found.access_key_id, found.session_token) == ("ENV", "tok")
    assert found.region == "eu-west-1" and found.endpoint == "http://s3only:9000"
    assert "environment" in found.source


def test_a_profile_from_the_files(tmp_path: Path) -> None:
    write(
        tmp_path,
        "credentials",
        "[default]\naws_access_key_id = D\naws_secret_access_key = d\n"
        "[team]\naws_access_key_id = T\naws_secret_access_key = t\n",
    )
    write(
        tmp_path,
        "config",
        "[default]\nregion = us-west-2\n"
        "[profile team]\nregion = eu-central-1\ns3 =\n  endpoint_url = http://minio:9000\n",
    )
    default = resolve({}, tmp_path)
    assert (default.access_key_id, default.region, default.endpoint) == ("D", "us-west-2", None)
    team = resolve({"AWS_PROFILE": "team"}, tmp_path)
    assert (team.access_key_id, team.secret_access_key) == ("T", "t")
    assert (team.region, team.endpoint) == ("eu-central-1", "http://minio:9000")
    assert "profile 'team'" in team.source


def test_files_named_by_variables(tmp_path: Path) -> None:
    creds = tmp_path / "elsewhere"
    creds.write_text("[default]\naws_access_key_id = X\naws_secret_access_key = x\n")
    found = resolve({"AWS_SHARED_CREDENTIALS_FILE": str(creds)}, tmp_path)
    assert found.access_key_id == "X"


def test_what_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="AWS_PROFILE names 'nope'"):
        resolve({"AWS_PROFILE": "nope"}, tmp_path)
    write(tmp_path, "config", "[profile sso]\nsso_session = corp\nregion = eu-west-1\n")
    with pytest.raises(StoreError, match="sso_session, which ovspec does not run"):
        resolve({"AWS_PROFILE": "sso"}, tmp_path)
    with pytest.raises(StoreError, match="needs its secret"):
        resolve({"AWS_ACCESS_KEY_ID": "only"}, tmp_path)
    write(tmp_path, "credentials", "not an ini file")
    with pytest.raises(StoreError, match="cannot read the AWS file"):
        resolve({}, tmp_path)


def test_remote_urls() -> None:
    config = RemoteConfig("s3://team-cache/ovspec/cpu/")
    assert (config.bucket, config.prefix) == ("team-cache", "ovspec/cpu")
    assert RemoteConfig("s3://team-cache").prefix == ""
    for bad in ("team-cache", "gs://team-cache/x", "s3://ab"):
        with pytest.raises(StoreError, match="not s3://BUCKET"):
            RemoteConfig(bad)
    env = {"OVSPEC_REMOTE": "s3://abc/p", "OVSPEC_REMOTE_READ_ONLY": "1"}
    from_env = RemoteConfig.from_env(env)
    assert from_env is not None and from_env.read_only and from_env.key_file is None
    assert RemoteConfig.from_env({}) is None


def test_open_remote_contacts_nothing(tmp_path: Path) -> None:
    remote = open_remote(RemoteConfig("s3://abc/p", read_only=True), {}, tmp_path)
    assert remote.read_only and remote.url == "s3://abc/p" and remote.keys is None


def test_obstore_is_imported_only_when_a_remote_is_configured() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, ovspec.cli.commands, ovspec.runtime.decoding, ovspec.store.local\n"
        "from ovspec.store.local import Store\n"
        "import tempfile; Store(tempfile.mkdtemp()).close()\n"
        "assert 'obstore' not in sys.modules, 'obstore imported without a remote'\n"
        "from ovspec.store.remote import RemoteConfig, open_remote\n"
        "open_remote(RemoteConfig('s3://abc/p'), {})\n"
        "assert 'obstore' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
