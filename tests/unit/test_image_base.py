"""Which base `image build` builds FROM without --base: debootstrap only where it can run
(root, installed), a base already on the machine otherwise, else exit 2 with the fix."""

from __future__ import annotations

import pytest

from provisioner.errors import PrerequisiteError
from provisioner.image.base_image import DEFAULT_BASE, choose_build_base

BUILT = "provisioner-base:bookworm-0123456789ab"


def choose(
    *,
    registry_base: str | None = None,
    built_present: bool = False,
    default_present: bool = False,
    is_root: bool = False,
    has_debootstrap: bool = True,
) -> tuple[str, str]:
    choice = choose_build_base(
        registry_base=registry_base,
        built_tag=BUILT,
        built_present=built_present,
        default_present=default_present,
        is_root=is_root,
        has_debootstrap=has_debootstrap,
    )
    return choice.tag, choice.how


def test_a_user_in_the_docker_group_builds_from_a_base_already_here() -> None:
    # the Debian base, built before by anyone, is a local image every docker user can use
    assert choose(built_present=True, default_present=True) == (BUILT, "built")
    # else the default registry base, once pulled
    assert choose(default_present=True) == (DEFAULT_BASE, "default")
    assert DEFAULT_BASE == "python:3.11-slim-bookworm"


def test_debootstrap_is_the_offline_path_for_root_only() -> None:
    assert choose(is_root=True) == (BUILT, "debootstrap")
    # root prefers the offline Debian base over a pulled registry image
    assert choose(is_root=True, default_present=True) == (BUILT, "debootstrap")
    # root without debootstrap (not Debian, a Mac's VM) takes the pulled base
    assert choose(is_root=True, has_debootstrap=False, default_present=True) == (
        DEFAULT_BASE,
        "default",
    )


def test_provisioner_base_image_comes_first() -> None:
    assert choose(registry_base="debian:bookworm", default_present=True) == (BUILT, "registry")


def test_no_base_and_no_root_is_exit_2_naming_the_fixes_never_debootstrap() -> None:
    with pytest.raises(PrerequisiteError) as caught:
        choose()
    err = caught.value
    assert err.exit_code == 2
    assert "needs root" in err.message and BUILT in err.message
    assert err.fix is not None
    assert f"docker pull {DEFAULT_BASE}" in err.fix
    assert "--base IMAGE" in err.fix and "sudo provisioner image build" in err.fix
    # positive control: the same machine as root runs debootstrap instead
    assert choose(is_root=True)[1] == "debootstrap"


def test_root_without_debootstrap_and_no_base_is_exit_2_naming_the_package() -> None:
    with pytest.raises(PrerequisiteError) as caught:
        choose(is_root=True, has_debootstrap=False)
    assert caught.value.exit_code == 2
    assert "`debootstrap` is not installed" in caught.value.message
    assert caught.value.fix is not None and "apt-get install -y debootstrap" in caught.value.fix


def test_a_docker_socket_refusing_the_user_names_the_docker_group_not_an_install() -> None:
    from provisioner.local import engine_error

    refused = engine_error(
        "Error while fetching server API version: ('Connection aborted.', "
        "PermissionError(13, 'Permission denied'))"
    )
    assert "docker group" in refused.message and refused.exit_code == 2
    assert refused.fix is not None and "usermod -aG docker" in refused.fix
    # positive control: no engine at all is still told to install and start one
    absent = engine_error("Error while fetching server API version: FileNotFoundError(2)")
    assert absent.fix is not None and "apt-get install -y docker.io" in absent.fix
