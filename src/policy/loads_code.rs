//! Options that make a program load code or config the rule never named: `git -c
//! core.fsmonitor=./evil.sh status`, `find . -exec …`, `ssh -o ProxyCommand=…`. An allow
//! rule never holds for a command carrying one (`command.rs` finds them, `Compiled::applies`
//! refuses the allow), so such a command asks a person, or gets its tool's own permission.
//!
//! Pure. One table, a row per option; a row found where it is not an option (a file named
//! `-c`) only makes a command ask, never run. The table is not every way a program can be
//! told to run code: an allow for a program that runs programs is never as fine as a deny
//! (docs/permissions.md, "Programs that run programs").

use super::command::is_program;
use super::global_options::{global_span, program_of};

/// How an option is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// A short option: `-c` alone, with its value attached (`-cfoo`), or in a cluster of
    /// short options (`-xc`).
    Short(char),
    /// `--name` alone or as `--name=value`.
    Long(&'static str),
    /// Any word starting with this: `--config` covers `--config-env` and `--config=x`.
    Prefix(&'static str),
    /// Exactly this word (`find -exec`, whose options are single words).
    Word(&'static str),
    /// A `name=value` setting whose name starts with this, in any case (git's keys are
    /// case-blind): `core.fsmonitor=./x`.
    Setting(&'static str),
    /// Any `NAME=value` word after the program (make's variable overrides: `SHELL=`, `CC=`).
    Assignment,
    /// The subcommand: the first word after the program's global options.
    Subcommand(&'static str),
}

/// Where in the command a row's option counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Among the program's global options, before its subcommand (`global_options.rs`).
    Global,
    /// Anywhere after the program.
    Anywhere,
}

/// One option that loads code or config.
#[derive(Debug, PartialEq, Eq)]
pub struct LoadsCode {
    /// Base names of the programs it belongs to.
    pub programs: &'static [&'static str],
    pub form: Form,
    pub place: Place,
    /// What it makes the program run or read.
    pub why: &'static str,
}

const GIT: &[&str] = &["git"];
const SSH: &[&str] = &["ssh", "scp", "sftp"];
const SHELLS: &[&str] = &["sh", "bash", "zsh", "dash", "ksh", "fish"];
const NODE: &[&str] = &["node", "nodejs"];
const NPM: &[&str] = &["npm", "npx", "pnpm", "yarn"];
const MAKE: &[&str] = &["make", "gmake"];
const TAR: &[&str] = &["tar", "gtar"];
const VIM: &[&str] = &["vim", "vi", "nvim", "ex", "view"];
const KUBE: &[&str] = &["kubectl", "helm"];

const fn row(programs: &'static [&'static str], form: Form, place: Place, why: &'static str) -> LoadsCode {
    LoadsCode { programs, form, place, why }
}

use Form::*;
use Place::*;

/// Every option that voids an allow. Keep one row per option, and a test per row in the
/// tests below.
pub const TABLE: &[LoadsCode] = &[
    row(
        GIT,
        Short('c'),
        Global,
        "sets any config for this run: core.fsmonitor, core.pager, core.sshCommand and alias.x=!… run programs",
    ),
    row(GIT, Long("--config-env"), Global, "sets config from an environment variable, as -c does"),
    row(GIT, Long("--exec-path"), Global, "runs git's own subcommands from another directory"),
    row(GIT, Long("--git-dir"), Global, "uses another repository, its config and its hooks"),
    row(GIT, Word("-C"), Global, "runs in another directory, under that repository's config and hooks"),
    row(GIT, Prefix("--upload-pack"), Anywhere, "runs this program as the remote side of a fetch or clone"),
    row(GIT, Prefix("--receive-pack"), Anywhere, "runs this program as the remote side of a push"),
    row(
        GIT,
        Prefix("--exec"),
        Anywhere,
        "push/fetch --exec names the remote program; rebase --exec runs a command after each commit",
    ),
    row(GIT, Prefix("--config"), Anywhere, "clone --config writes config the new repository keeps"),
    row(GIT, Prefix("--template"), Anywhere, "copies hooks from a directory; they run at the next commit or checkout"),
    row(
        GIT,
        Setting("core."),
        Anywhere,
        "a core.* setting as an argument (core.fsmonitor, core.pager, core.hooksPath, core.sshCommand)",
    ),
    row(GIT, Subcommand("config"), Anywhere, "writes config that every later git command loads"),
    row(SSH, Short('o'), Anywhere, "ProxyCommand, LocalCommand, KnownHostsCommand run programs"),
    row(SSH, Short('F'), Anywhere, "a config file, which can name those programs"),
    row(&["scp", "sftp"], Short('S'), Anywhere, "the program run instead of ssh"),
    row(&["ssh"], Short('I'), Anywhere, "a PKCS#11 library loaded into ssh"),
    row(&["rsync"], Short('e'), Anywhere, "the remote shell: any program"),
    row(&["rsync"], Prefix("--rsh"), Anywhere, "the remote shell: any program"),
    row(&["rsync"], Prefix("--rsync-path"), Anywhere, "the program run on the remote side"),
    row(TAR, Prefix("--to-command"), Anywhere, "pipes each extracted file to a program"),
    row(TAR, Prefix("--use-compress-program"), Anywhere, "the program run to compress or decompress"),
    row(TAR, Short('I'), Anywhere, "the program run to compress or decompress"),
    row(TAR, Prefix("--checkpoint-action"), Anywhere, "exec=… runs a program at each checkpoint"),
    row(TAR, Prefix("--info-script"), Anywhere, "a script run at the end of each volume"),
    row(TAR, Prefix("--new-volume-script"), Anywhere, "a script run at the end of each volume"),
    row(TAR, Short('F'), Anywhere, "a script run at the end of each volume"),
    row(TAR, Prefix("--rsh-command"), Anywhere, "the remote shell: any program"),
    row(TAR, Prefix("--rmt-command"), Anywhere, "the remote tape program"),
    row(&["find"], Word("-exec"), Anywhere, "runs a program on each file"),
    row(&["find"], Word("-execdir"), Anywhere, "runs a program on each file"),
    row(&["find"], Word("-ok"), Anywhere, "runs a program on each file"),
    row(&["find"], Word("-okdir"), Anywhere, "runs a program on each file"),
    row(&["env"], Short('S'), Anywhere, "splits one word into a whole command line the rule never saw"),
    row(&["env"], Prefix("--split-string"), Anywhere, "splits one word into a whole command line the rule never saw"),
    row(SHELLS, Short('c'), Anywhere, "runs its argument as a script"),
    row(SHELLS, Long("--rcfile"), Anywhere, "runs a start-up file"),
    row(SHELLS, Long("--init-file"), Anywhere, "runs a start-up file"),
    row(&["python"], Short('c'), Anywhere, "runs its argument as a program"),
    row(NODE, Short('e'), Anywhere, "runs its argument as a program"),
    row(NODE, Long("--eval"), Anywhere, "runs its argument as a program"),
    row(NODE, Short('p'), Anywhere, "runs its argument as a program and prints the result"),
    row(NODE, Long("--print"), Anywhere, "runs its argument as a program and prints the result"),
    row(NODE, Short('r'), Anywhere, "loads a module before the program"),
    row(NODE, Long("--require"), Anywhere, "loads a module before the program"),
    row(NODE, Long("--import"), Anywhere, "loads a module before the program"),
    row(NODE, Prefix("--loader"), Anywhere, "loads a module that rewrites every other"),
    row(NODE, Prefix("--experimental-loader"), Anywhere, "loads a module that rewrites every other"),
    row(&["perl"], Short('e'), Anywhere, "runs its argument as a program"),
    row(&["perl"], Short('E'), Anywhere, "runs its argument as a program"),
    row(&["perl"], Short('M'), Anywhere, "loads a module, which runs its import"),
    row(&["ruby"], Short('e'), Anywhere, "runs its argument as a program"),
    row(&["ruby"], Short('r'), Anywhere, "loads a library before the program"),
    row(&["php"], Short('r'), Anywhere, "runs its argument as a program"),
    row(&["php"], Short('d'), Anywhere, "sets an ini value (auto_prepend_file loads a file of code)"),
    row(&["lua"], Short('e'), Anywhere, "runs its argument as a program"),
    row(&["lua"], Short('l'), Anywhere, "loads a library before the program"),
    row(&["awk", "gawk", "mawk"], Short('f'), Anywhere, "reads the program from a file"),
    row(MAKE, Long("--eval"), Anywhere, "evaluates its argument as makefile code"),
    row(MAKE, Short('f'), Anywhere, "reads another makefile: other recipes"),
    row(MAKE, Prefix("--file"), Anywhere, "reads another makefile: other recipes"),
    row(MAKE, Prefix("--makefile"), Anywhere, "reads another makefile: other recipes"),
    row(MAKE, Short('C'), Anywhere, "runs another directory's makefile"),
    row(MAKE, Prefix("--directory"), Anywhere, "runs another directory's makefile"),
    row(MAKE, Assignment, Anywhere, "overrides a variable: SHELL=, CC= and the like name the programs recipes run"),
    row(NPM, Prefix("--script-shell"), Anywhere, "the shell scripts run in: any program"),
    row(NPM, Prefix("--userconfig"), Anywhere, "another .npmrc: script-shell, node-options, registries"),
    row(NPM, Prefix("--globalconfig"), Anywhere, "another .npmrc: script-shell, node-options, registries"),
    row(NPM, Prefix("--node-options"), Anywhere, "options for every node it starts (--require loads code)"),
    row(NPM, Word("-c"), Anywhere, "exec -c runs its argument as a shell command"),
    row(NPM, Prefix("--call"), Anywhere, "exec --call runs its argument as a shell command"),
    row(&["cargo"], Prefix("--config"), Anywhere, "sets config: target runners and rustc wrappers run programs"),
    row(
        &["docker", "podman"],
        Prefix("--config"),
        Anywhere,
        "another client config: its credential helpers run programs",
    ),
    row(KUBE, Prefix("--kubeconfig"), Anywhere, "another kubeconfig: its exec credential plugins run programs"),
    row(&["helm"], Prefix("--post-renderer"), Anywhere, "runs a program over the rendered manifests"),
    row(&["zip"], Word("-TT"), Anywhere, "the program run to test the archive"),
    row(&["zip"], Prefix("--unzip-command"), Anywhere, "the program run to test the archive"),
    row(VIM, Short('c'), Anywhere, "runs an editor command (:! runs programs)"),
    row(VIM, Prefix("--cmd"), Anywhere, "runs an editor command (:! runs programs)"),
    row(VIM, Short('S'), Anywhere, "sources a file of editor commands"),
    row(VIM, Prefix("+"), Anywhere, "runs an editor command (:! runs programs)"),
];

/// The first row of `TABLE` that `words` (a command: its program, then its arguments) carry.
pub fn loads_code(words: &[String]) -> Option<&'static LoadsCode> {
    let (first, arguments) = words.split_first()?;
    let global = program_of(words).map(|program| global_span(program, arguments));
    TABLE.iter().find(|row| {
        if !row.programs.iter().any(|name| is_program(first, name)) {
            return false;
        }
        let span = global.unwrap_or(0);
        match (row.form, row.place) {
            (Subcommand(name), _) => arguments.get(span).is_some_and(|word| word == name),
            (form, Global) => arguments[..span].iter().any(|word| carries(form, word)),
            (form, Anywhere) => arguments.iter().any(|word| carries(form, word)),
        }
    })
}

/// Whether `word` is written in `form`.
fn carries(form: Form, word: &str) -> bool {
    match form {
        Short(letter) => {
            // `-xc`, `-cvalue`: a cluster of letters, up to a value attached after one (`-r./x`,
            // `-oName=value`); not `--long`.
            word.strip_prefix('-').is_some_and(|cluster| {
                !cluster.starts_with('-')
                    && cluster.chars().take_while(char::is_ascii_alphanumeric).any(|c| c == letter)
            })
        }
        Long(name) => word == name || word.strip_prefix(name).is_some_and(|rest| rest.starts_with('=')),
        Prefix(prefix) => word.starts_with(prefix),
        Word(exact) => word == exact,
        Setting(prefix) => {
            word.contains('=') && word.get(..prefix.len()).is_some_and(|start| start.eq_ignore_ascii_case(prefix))
        }
        Assignment => word.split_once('=').is_some_and(|(name, _)| !name.is_empty() && !name.starts_with('-')),
        Subcommand(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row_of(line: &str) -> Option<&'static LoadsCode> {
        let words: Vec<String> = line.split(' ').map(str::to_string).collect();
        loads_code(&words)
    }

    /// A command per row of `TABLE`, in its order: each is caught by exactly that row.
    #[test]
    fn every_row_catches_its_option() {
        let examples = [
            "git -c core.fsmonitor=./evil.sh status",
            "git --config-env=core.pager=PAGER log",
            "git --exec-path=/tmp/bin status",
            "git --git-dir=/tmp/evil/.git status",
            "git -C ../other status",
            "git fetch --upload-pack=./evil.sh origin",
            "git push --receive-pack=./evil.sh origin",
            "git rebase --exec=./evil.sh main",
            "git clone --config=x.y=z ../repo",
            "git init --template=./hooks",
            "git clone ../repo Core.FsMonitor=./x",
            "git config alias.st !sh",
            "ssh -oProxyCommand=./evil.sh host",
            "scp -F ./ssh_config a host:b",
            "scp -S ./evil.sh a host:b",
            "ssh -I ./lib.so host",
            "rsync -avze ./evil.sh a host:b",
            "rsync --rsh=./evil.sh a host:b",
            "rsync --rsync-path=./evil.sh a host:b",
            "tar -xf a.tar --to-command=./evil.sh",
            "tar --use-compress-program=./evil.sh -xf a",
            "tar -I ./evil.sh -xf a",
            "tar --checkpoint=1 --checkpoint-action=exec=./evil.sh -cf a .",
            "tar --info-script=./evil.sh -cf a .",
            "tar --new-volume-script=./evil.sh -cf a .",
            "tar -F ./evil.sh -cf a .",
            "tar --rsh-command=./evil.sh -cf host:a .",
            "tar --rmt-command=./evil.sh -cf host:a .",
            "find . -exec ./evil.sh {}",
            "find . -execdir ./evil.sh {}",
            "find . -ok ./evil.sh {}",
            "find . -okdir ./evil.sh {}",
            "env -S ./evil.sh",
            "env --split-string=./evil.sh",
            "bash -xc id",
            "bash --rcfile ./evil.sh",
            "bash --init-file=./evil.sh",
            "python3.12 -c pass",
            "node -e 1",
            "node --eval=1",
            "node -p 1",
            "node --print 1",
            "node -r ./evil.js app.js",
            "node --require=./evil.js app.js",
            "node --import ./evil.mjs app.js",
            "node --loader=./evil.mjs app.js",
            "node --experimental-loader ./evil.mjs app.js",
            "perl -ne print",
            "perl -E say",
            "perl -MPOSIX script.pl",
            "ruby -e 1",
            "ruby -r./evil script.rb",
            "php -r 1",
            "php -d auto_prepend_file=./evil.php index.php",
            "lua -e 1",
            "lua -l evil script.lua",
            "awk -f ./evil.awk data",
            "make --eval=x:",
            "make -f ./evil.mk",
            "make --file=./evil.mk",
            "make --makefile=./evil.mk",
            "make -C ../other",
            "make --directory=../other",
            "make SHELL=./evil.sh test",
            "npm test --script-shell=./evil.sh",
            "npm install --userconfig ./npmrc",
            "npm install --globalconfig ./npmrc",
            "npm test --node-options=--require=./evil.js",
            "npm exec -c ./evil.sh",
            "npx --call=./evil.sh",
            "cargo --config target.x.runner=./evil.sh test",
            "docker --config ./evil ps",
            "helm --kubeconfig ./evil list",
            "helm install x ./chart --post-renderer ./evil.sh",
            "zip -T -TT ./evil.sh a.zip file",
            "zip -T --unzip-command=./evil.sh a.zip file",
            "vim -c !sh file",
            "vim --cmd !sh file",
            "vim -S ./evil.vim",
            "vim +!sh file",
        ];
        assert_eq!(examples.len(), TABLE.len(), "an example per row");
        for (index, row) in TABLE.iter().enumerate() {
            assert!(!TABLE[..index].contains(row), "row {index} is written twice");
        }
        for (index, (example, expected)) in examples.iter().zip(TABLE).enumerate() {
            let found = row_of(example).unwrap_or_else(|| panic!("row {index} misses {example:?}"));
            assert_eq!(found, expected, "{example:?}: row {index}");
        }
    }

    #[test]
    fn ordinary_commands_of_the_same_programs_load_nothing() {
        for line in [
            "git status --short",
            "git commit -m fix",
            "git log --oneline -n 5",
            "git diff -C",
            "git -p log",
            "git push origin main",
            "ssh host uptime",
            "rsync -av src/ dst/",
            "tar -xzf a.tar.gz",
            "find . -name x -print",
            "env -i ls",
            "bash ./script.sh",
            "python3 -m pytest",
            "node app.js",
            "make test",
            "make -j4 test",
            "npm run build",
            "cargo build --release",
            "docker ps",
            "kubectl get pods",
            "vim file",
            "ls -c",
            "cat core.fsmonitor=x",
        ] {
            assert!(row_of(line).is_none(), "{line}: {:?}", row_of(line).map(|r| r.why));
        }
    }

    /// A global-only option counts before the subcommand, not as one of its own options.
    #[test]
    fn a_global_option_counts_only_before_the_subcommand() {
        assert!(row_of("git -c x=y status").is_some());
        assert!(row_of("git --no-pager -C . status").is_some());
        assert!(row_of("git commit -c HEAD").is_none(), "commit's own -c reuses a message");
        assert!(row_of("git log -C").is_none());
        assert!(row_of("git --no-pager config --get user.name").is_some(), "config after global options");
    }
}
