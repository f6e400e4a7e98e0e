//! One module per `cella` subcommand.

pub mod skills;
