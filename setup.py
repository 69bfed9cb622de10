"""Packaging for launchpad and courier."""
import setuptools

TEST_REQUIRES = [
    'pytest>=7',
    'pytest-timeout>=2.1',
    'hypothesis>=6.100',     # property tests of courier's wire decoders
    'grpcio-tools==1.76.0',  # pinned: the staleness test regenerates courier's protos with it
    'protobuf>=6.31.1',      # only the tests import courier_pb2; the runtime has its own wire code
    'cryptography>=41',      # TLS certificates made at test time
    'kubernetes-validate>=1.28',
    'kubernetes>=28',        # the kubernetes launcher's API layer, against a canned server
    'pyyaml>=6',
    'aiohttp>=3.8',          # the dashboard (DASHBOARD_REQUIRES), tested in a real browser:
    'prometheus_client>=0.16',
    'playwright>=1.40',      # drives Debian's chromium; never downloads a browser of its own
]

DASHBOARD_REQUIRES = ['aiohttp>=3.8', 'prometheus_client>=0.16']

setuptools.setup(
    name='launchpad',
    version='0.1.0',
    description='Write a distributed program as a graph of services; run it as threads, '
                'processes, over SSH, on Slurm or on Kubernetes.',
    long_description=open('README.md').read(),
    long_description_content_type='text/markdown',
    packages=setuptools.find_packages(include=['launchpad', 'launchpad.*', 'courier', 'courier.*']),
    package_data={'launchpad.observe': ['static/*']},  # the dashboard's page, script and style
    python_requires='>=3.9',
    install_requires=[
        'grpcio>=1.76.0',
        'cloudpickle>=2.2',
        'absl-py>=1.0',
        'portpicker>=1.5',
        'psutil>=5.9',
        'numpy>=1.22',
    ],
    extras_require={
        'test': TEST_REQUIRES,
        'reverb': ['dm-reverb>=0.14.0', 'tensorflow~=2.15.0'],
        'kubernetes': ['kubernetes>=28', 'pyyaml>=6'],
        'dashboard': DASHBOARD_REQUIRES,
        'benchmarks': ['matplotlib>=3.5'],
    },
    classifiers=[
        'Programming Language :: Python :: 3',
        'License :: OSI Approved :: Apache Software License',
    ],
)
