//! `replicate`: the replicator's flags (one per `MIRROR_REPLICATOR_*`
//! variable, a flag winning over its variable) read into its
//! configuration, and the end of a run reported. The binary adds the
//! logging, the signals and the runtime between the two.

use tokio::sync::watch;

use crate::config::process_vars;
use crate::config::replicator::{flag_name, ReplicatorConfig, PREFIX, VARIABLES};
use crate::sync::error_chain;

use super::{EXIT_FAILED, EXIT_OK};

/// The replicator's flags, one per variable of its table.
fn command() -> clap::Command {
    let mut command = clap::Command::new("kafka-mirror-proxy replicate").about(
        "Copy a source cluster's topics, batch by batch, through kafka-mirror-proxy into the \
         destination. Every flag is also an environment variable; a flag wins.",
    );
    for (name, default, meaning) in VARIABLES {
        let mut arg = clap::Arg::new(*name)
            .long(flag_name(name))
            .value_name("VALUE")
            .help(format!(
                "{meaning} [env: {PREFIX}{name}] [default: {default}]"
            ));
        if matches!(*default, "true" | "false") {
            arg = arg.num_args(0..=1).default_missing_value("true");
        }
        command = command.arg(arg);
    }
    command
}

/// The replicator's configuration from `args` (the words after
/// `replicate`) and the `MIRROR_REPLICATOR_*` variables; or, having
/// printed the help or what is wrong, the exit code: 0 after `--help`, 2
/// for a bad flag or setting.
pub fn replicator_config(args: Vec<String>) -> Result<ReplicatorConfig, u8> {
    let matches = match command()
        .try_get_matches_from(std::iter::once("replicate".to_string()).chain(args))
    {
        Ok(m) => m,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_FAILED } else { EXIT_OK };
            let _ = e.print();
            return Err(code);
        }
    };
    let mut vars = process_vars(PREFIX).map_err(|e| {
        eprintln!("kafka-mirror-proxy replicate: {e}");
        EXIT_FAILED
    })?;
    for (name, _, _) in VARIABLES {
        if let Some(v) = matches.get_one::<String>(name) {
            vars.insert(format!("{PREFIX}{name}"), v.clone());
        }
    }
    ReplicatorConfig::from_vars(&vars).map_err(|e| {
        eprintln!("kafka-mirror-proxy replicate: {e}");
        EXIT_FAILED
    })
}

/// Copies until `stop` turns true (or the replicator ends on its own),
/// then prints its report, or logs and prints why it stopped; its exit
/// code: 0 stopped or caught up, 1 an error, 3 the proxy fenced the link.
pub async fn replicate(config: ReplicatorConfig, stop: watch::Receiver<bool>) -> u8 {
    match crate::replicate::run(config, stop).await {
        Ok(report) => {
            println!("{report}");
            EXIT_OK
        }
        Err(e) => {
            let chain = error_chain(&e);
            tracing::error!(error = %chain, "replicator stopped");
            eprintln!("kafka-mirror-proxy replicate: {chain}");
            e.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_flag_per_variable() {
        let command = command();
        for (name, _, _) in VARIABLES {
            let arg = command
                .get_arguments()
                .find(|a| a.get_id() == *name)
                .expect("a flag for each variable");
            assert_eq!(arg.get_long(), Some(flag_name(name).as_str()));
        }
        assert_eq!(replicator_config(vec!["--nope".into()]).err(), Some(2));
    }
}
