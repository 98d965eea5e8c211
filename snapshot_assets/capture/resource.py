"""`capture`: the capture block's page storage and index, for the assets, check and job.

Reads the code location's configuration (or `config_file`), so the Dagster side looks at the
same destination and index the capture service writes.
"""

import dagster as dg

from resources.aws_credentials import CredentialProfiles
from resources.capture.index import IndexBackend, backends
from resources.capture.settings import CaptureSettings
from resources.destinations.base import Destination
from resources.destinations.factory import build_destination
from snapshot_assets.config import SnapshotterConfig, load_config
from snapshot_assets.tables import config


class CaptureResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    config_file: str = ""  # default: the code location's configuration

    def _config(self) -> SnapshotterConfig:
        return load_config(self.config_file) if self.config_file else config()

    def settings(self) -> CaptureSettings:
        loaded = self._config()
        if loaded.capture is None:
            raise dg.Failure(f"{loaded.file} has no capture block: there are no captured pages to look at")
        return loaded.capture

    def destination(self) -> Destination:
        profiles = CredentialProfiles.shared(self._config().credentials)
        return build_destination(self.settings().storage.destination, profiles=profiles)

    def indexes(self, destination: Destination) -> list[IndexBackend]:
        return backends(self.settings().index, destination)
