from perfcast.cli.main import entry

entry()
