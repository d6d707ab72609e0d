package SquealSuite;
# squeal's shim for memcached's own test suite (t/*.t of the memcached source, fetched by
# scripts/setup.sh; never copied into this repository). Load it before the test file runs:
#
#   cd MEMCACHED_SRC && perl -It/lib -I tests/router/perl -MSquealSuite t/getset.t
#
# It replaces MemcachedTest::new_memcached (before the test file's `use MemcachedTest` imports
# it), so every server a test starts is a real memcached (the installed binary, not the
# source tree's memcached-debug) on a free loopback port plus a squeal-router in front of it
# (config: one PoolRoute to that memcached; --enable-flush-cmd; --max-item-size as the test's
# -I). The test gets the router's address. Environment:
#
#   SQUEAL_ROUTER_BIN   the squeal-router binary; unset or empty: the test talks to memcached
#                       directly (the baseline the router is compared with)
#   SQUEAL_SUITE_TMP    a directory for router configs, spools and logs (default: a temp dir)
#   SQUEAL_SUITE_SKIP   assertions to skip: lines `t/FILE.t:LINE<TAB>reason`, the place of the
#                       assertion in the test file (the suite is pinned to memcached 1.6.18's
#                       source, so places do not move); each is reported as a TAP skip with its
#                       reason. For what the router cannot do by design.
#
# Through the router, MemcachedTest::supports_extstore() is false: extstore is a server's storage
# engine, and the extstore parts of the tests wait on its per-server stats.
# A test's `-Y FILE` (memcached's ascii auth) also starts the router with `--auth-file FILE
# --upstream-auth-file FILE`, as docs/router.md says to run it in front of `-Y` servers.
#
# With SSL_TEST=1 (memcached's own switch: MemcachedTest::enabled_tls_testing) every hop is TLS:
# memcached runs with -Z and the suite's own t/server_crt.pem, the router serves the test on an
# --ssl-port with that certificate and reaches memcached over TLS (pool security_mech tls,
# verified against t/cacert.pem for the certificate's name test.com). A test's
# `-l notls:H:P1,H:P2` becomes the router's plaintext -p P1 and --ssl-port P2.
use strict;
use warnings;
use File::Temp qw(tempdir);
use IO::Socket::INET;
use POSIX ":sys_wait_h";
use Test::Builder;
use MemcachedTest ();

my $memcached_exe = $ENV{SQUEAL_MEMCACHED_BIN} || '/usr/bin/memcached';
my $router_bin    = $ENV{SQUEAL_ROUTER_BIN} || '';
my $tmp           = $ENV{SQUEAL_SUITE_TMP} || tempdir(CLEANUP => 1);
my $count         = 0;

# Dies with memcached's own messages (tests match /^Failed/ when a server must not start).
sub wait_port {
    my ($port, $pid, $what) = @_;
    for (1 .. 200) {
        my $conn = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port");
        return $conn if $conn;
        die "Failed to connect: $what not running\n" if waitpid($pid, WNOHANG) != 0;
        select undef, undef, undef, 0.025;
    }
    die "Failed to startup/connect to $what on port $port\n";
}

sub spawn {
    my ($log, @cmd) = @_;
    my $pid = fork();
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        open STDOUT, '>>', $log or die "$log: $!";
        open STDERR, '>&', \*STDOUT or die "stderr: $!";
        exec @cmd or die "exec $cmd[0]: $!";
    }
    return $pid;
}

# memcached's -I syntax (bytes, k, m) is the router's --max-item-size syntax too.
sub item_size {
    my ($args) = @_;
    return $1 if $args =~ /(?:^|\s)-I\s*(\S+)/;
    return undef;
}

sub new_memcached {
    my ($args, $passed_port) = @_;
    $args = '' unless defined $args;
    die "squeal shim: unix sockets (-s) are not applicable through the router\n" if $args =~ /(?:^|\s)-s\s/;
    # TCP only: the port is ours (-p, UDP off); a test's -l goes to memcached (`-l fooble` must fail).
    $args =~ s/(?:^|\s)-[pU]\s*\S+//g;
    my $tls = $router_bin && MemcachedTest::enabled_tls_testing();
    my ($plain_port, $tls_port);
    if ($tls && $args =~ s/(?:^|\s)-l\s*notls:[^:,\s]+:(\d+),[^:,\s]+:(\d+)//) {
        ($plain_port, $tls_port) = ($1, $2);  # the router's two ports
    }
    $args .= ' -l 127.0.0.1' unless $args =~ /(?:^|\s)-l\s/;
    $args .= ' -u root' if $< == 0;
    if ($tls) {
        $args .= ' -Z';
        $args .= ' -o ssl_chain_cert=t/server_crt.pem' unless $args =~ /ssl_chain_cert=/;
        $args .= ' -o ssl_key=t/server_key.pem' unless $args =~ /ssl_key=/;
    }
    $count++;
    my $mc_port = MemcachedTest::free_port();
    my @mc = ($memcached_exe, split(' ', $args), '-p', $mc_port, '-U', '0');
    my $mc_pid = spawn("$tmp/memcached$count.log", @mc);
    my $conn = wait_port($mc_port, $mc_pid, 'memcached');
    if (!$router_bin) {
        return Memcached::Handle->new(pid => $mc_pid, conn => $conn, host => '127.0.0.1', port => $mc_port);
    }
    close $conn;
    my $port = $passed_port || MemcachedTest::free_port();
    my $config = "$tmp/router$count.json";
    my $mech = $tls ? ', "security_mech": "tls"' : '';
    open my $fh, '>', $config or die "$config: $!";
    print $fh qq({"pools": {"p": {"servers": ["127.0.0.1:$mc_port"]$mech}}, "route": "PoolRoute|p"}\n);
    close $fh;
    my $listen_port = $port;
    my @tls_args;
    if ($tls) {
        $tls_port ||= $port;
        $listen_port = $plain_port || MemcachedTest::free_port();
        @tls_args = ('--ssl-port', $tls_port, '--pem-cert-path', 't/server_crt.pem', '--pem-key-path',
                     't/server_key.pem', '--pem-ca-path', 't/cacert.pem', '--ssl-service-identity', 'test.com');
    }
    my @router = ($router_bin, '--config-file', $config, '-p', $listen_port, '--listen', '127.0.0.1',
                  '--spool-dir', "$tmp/spool$count", '--enable-flush-cmd', @tls_args);
    push @router, '--auth-file', $1, '--upstream-auth-file', $1 if $args =~ /(?:^|\s)-Y\s*(\S+)/;
    my $size = item_size($args);
    push @router, '--max-item-size', $size if defined $size;
    my $router_pid = spawn("$tmp/router$count.log", @router);
    $conn = wait_port($listen_port, $router_pid, 'squeal-router');
    if ($tls) {
        close $conn;
        wait_port($tls_port, $router_pid, 'squeal-router (TLS)');
        $port = $tls_port;
        $conn = IO::Socket::SSL->new(PeerAddr => "127.0.0.1:$port", SSL_verify_mode => 0,
                                     SSL_cert_file => 't/client_crt.pem', SSL_key_file => 't/client_key.pem')
            or die "squeal shim: no TLS connection to the router: $IO::Socket::SSL::SSL_ERROR\n";
    }
    return SquealSuite::Handle->new(pid => $router_pid, memcached_pid => $mc_pid, conn => $conn,
                                    host => '127.0.0.1', port => $port, memcached_port => $mc_port);
}

# Assertions the router cannot pass by design are skipped by place (SQUEAL_SUITE_SKIP, set by
# tests/router/test_memcached_suite.py with the reason for each). Test::More's assertions all end in
# Test::Builder::ok, whose caller() is the assertion's place in the test file; a skipped assertion
# is reported as a TAP skip with its reason, so the plan still adds up and `prove` counts it.
my %skips;
for (split /\n/, ($ENV{SQUEAL_SUITE_SKIP} || '')) {
    my ($where, $why) = split /\t/, $_, 2;
    $skips{$where} = $why || 'by design' if $where;
}
if (%skips) {
    no warnings 'redefine';
    my $ok = \&Test::Builder::ok;
    *Test::Builder::ok = sub {
        my ($self) = @_;
        my (undef, $file, $line) = $self->caller;
        my $why = $skips{"$file:$line"};
        if (defined $why) {
            $self->skip("squeal-router: $why");
            return 1;
        }
        goto &$ok;
    };
}

{
    no warnings 'redefine';
    *MemcachedTest::new_memcached = \&new_memcached;
    *MemcachedTest::get_memcached_exe = sub { $memcached_exe };
    *MemcachedTest::supports_extstore = sub { 0 } if $router_bin;
}

package SquealSuite::Handle;
# A router plus its memcached: stopping the handle stops both.
use parent -norequire, 'Memcached::Handle';
use POSIX ":sys_wait_h";

sub DESTROY {
    my $self = shift;
    kill 'INT', $self->{pid};
    kill 'KILL', $self->{memcached_pid};
    waitpid($_, 0) for ($self->{pid}, $self->{memcached_pid});
}

sub stop {
    my $self = shift;
    kill 'TERM', $self->{pid}, $self->{memcached_pid};
}

1;
