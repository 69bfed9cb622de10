"""The `ssh` platform: run a program's nodes on hosts you can ssh into (see `launcher`)."""
from launchpad.launch.ssh.launcher import (SshHost, SshHosts, SshLauncher, SshOptions,
                                           SshPreflightError)

__all__ = ['SshHost', 'SshHosts', 'SshLauncher', 'SshOptions', 'SshPreflightError']
