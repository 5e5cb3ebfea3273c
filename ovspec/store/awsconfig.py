"""Where the remote's endpoint, region and credentials come from: the standard AWS
variables, then the standard AWS files (obstore reads the variables but not the files).
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ovspec.errors import StoreError

DEFAULT_REGION = "us-east-1"
# Profile settings that need a credential provider ovspec does not implement.
_UNSUPPORTED = ("sso_start_url", "sso_session", "credential_process", "role_arn")


@dataclass(frozen=True)
class AwsSettings:
    """What was found, and where (``source`` says it for error messages and ``--json``)."""

    region: str
    endpoint: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    source: str = "obstore's default chain"

    def __post_init__(self) -> None:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise StoreError(f"{self.source}: an access key id needs its secret, and the reverse")

    @property
    def has_keys(self) -> bool:
        return self.access_key_id is not None


def _read(path: Path) -> configparser.ConfigParser | None:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with path.open(encoding="utf-8") as f:
            parser.read_file(f)
    except FileNotFoundError:
        return None
    except (OSError, configparser.Error, UnicodeDecodeError) as exc:
        raise StoreError(f"cannot read the AWS file {path} ({exc})") from None
    return parser


def _nested(value: str, name: str) -> str | None:
    """``s3 =`` sub-settings: indented ``name = value`` lines under one key."""
    for line in value.splitlines():
        sub, sep, found = line.partition("=")
        if sep and sub.strip() == name:
            return found.strip() or None
    return None


def resolve(environ: Mapping[str, str] | None = None, home: Path | None = None) -> AwsSettings:
    """The settings the AWS tools would use for S3, in their order of precedence:
    variables first, then the profile's credentials file, then its config file.

    Read: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
    ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``,
    ``AWS_PROFILE``, ``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_CONFIG_FILE``, and in those
    files a profile's static keys, ``region`` and ``endpoint_url`` (top level or under
    ``s3 =``). Refused from files, in one line: SSO, ``credential_process``,
    ``role_arn``. With nothing configured, obstore's own chain runs (web identity, ECS,
    instance metadata)."""
    env = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    creds_path = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    config_path = Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    creds = _read(creds_path)
    config = _read(config_path)
    in_creds = creds[profile] if creds is not None and creds.has_section(profile) else None
    section = profile if profile == "default" else f"profile {profile}"
    in_config = config[section] if config is not None and config.has_section(section) else None
    if profile != "default" and in_creds is None and in_config is None:
        raise StoreError(
            f"AWS_PROFILE names {profile!r}, which is in neither {creds_path} nor {config_path}"
        )

    def setting(name: str) -> str | None:
        for part in (in_creds, in_config):
            if part is not None and part.get(name):
                return str(part.get(name)).strip()
        return None

    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or setting("region")
    nested_s3 = setting("s3")
    endpoint = (
        env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL")
        or (_nested(nested_s3, "endpoint_url") if nested_s3 else None)
        or setting("endpoint_url")
    )
    if env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_SECRET_ACCESS_KEY"):
        return AwsSettings(
            region=region or DEFAULT_REGION,
            endpoint=endpoint,
            access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
            source="the AWS_* environment variables",
        )
    key_id = setting("aws_access_key_id")
    if key_id is not None:
        in_file = in_creds is not None and in_creds.get("aws_access_key_id")
        return AwsSettings(
            region=region or DEFAULT_REGION,
            endpoint=endpoint,
            access_key_id=key_id,
            secret_access_key=setting("aws_secret_access_key"),
            session_token=setting("aws_session_token"),
            source=f"profile {profile!r} in {creds_path if in_file else config_path}",
        )
    unsupported = [name for name in _UNSUPPORTED if setting(name)]
    if unsupported:
        raise StoreError(
            f"profile {profile!r} gets its credentials through {unsupported[0]}, which ovspec "
            "does not run; export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
            "AWS_SESSION_TOKEN), e.g. from `aws configure export-credentials`"
        )
    return AwsSettings(region=region or DEFAULT_REGION, endpoint=endpoint)
