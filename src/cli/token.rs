//! Where a client command's bearer token comes from: `--token-file PATH`, `KESTREL_TOKEN`, or
//! `--token`, which still works but is warned about, since every local user reads a process's
//! command line in `/proc/<pid>/cmdline` (issue 35, finding 16; docs/security.md).

use std::path::Path;

use super::client::CliError;

/// What the warning about `--token` says; it never repeats the token.
pub const COMMAND_LINE_WARNING: &str = "kestrel: warning: --token puts the token on the command line, where every \
local user can read it (/proc/<pid>/cmdline); use KESTREL_TOKEN or --token-file instead";

/// The token of `--token` (`flag`), `--token-file` (`file`) or `KESTREL_TOKEN` (`env`), in that
/// order; the two options together are a usage error, and an empty token is none.
pub fn resolve(flag: Option<&str>, file: Option<&Path>, env: Option<String>) -> Result<Option<String>, CliError> {
    let token = match (flag, file) {
        (Some(_), Some(_)) => return Err(CliError::Usage("give --token or --token-file, not both".into())),
        (Some(token), None) => {
            eprintln!("{COMMAND_LINE_WARNING}");
            Some(token.to_string())
        }
        (None, Some(path)) => Some(read(path)?),
        (None, None) => env,
    };
    Ok(token.map(|token| token.trim().to_string()).filter(|token| !token.is_empty()))
}

/// The token in `path`: its first line, without the whitespace around it.
fn read(path: &Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| CliError::Usage(format!("--token-file {}: {error}", path.display())))?;
    let token = text.lines().next().unwrap_or_default().trim().to_string();
    if token.is_empty() {
        return Err(CliError::Usage(format!("--token-file {}: the file holds no token", path.display())));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_comes_from_the_flag_the_file_or_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "  from-the-file \nsecond line\n").unwrap();
        let env = || Some("from-the-environment".to_string());
        assert_eq!(
            resolve(None, Some(&file), env()),
            Ok(Some("from-the-file".into())),
            "the file wins over the environment"
        );
        assert_eq!(resolve(Some("from-the-flag"), None, env()), Ok(Some("from-the-flag".into())));
        assert_eq!(resolve(None, None, env()), Ok(Some("from-the-environment".into())));
        assert_eq!(resolve(None, None, Some(" ".into())), Ok(None), "an empty token is none");
        assert_eq!(resolve(None, None, None), Ok(None));
        assert!(matches!(resolve(Some("x"), Some(&file), None), Err(CliError::Usage(_))));
        assert!(matches!(resolve(None, Some(&dir.path().join("missing")), None), Err(CliError::Usage(_))));
        std::fs::write(&file, "\n").unwrap();
        assert!(matches!(resolve(None, Some(&file), env()), Err(CliError::Usage(_))), "an empty file is a mistake");
    }
}
